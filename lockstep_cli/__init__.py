"""`lockstep`: the command line over Lockstep's read API, for people on login nodes and CI jobs.

A client only: the standard library for HTTP, `websockets` for `--follow`; it never imports the
server (`.importlinter`), so it ships in the agent's distribution.
"""
