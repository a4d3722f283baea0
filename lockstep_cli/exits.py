"""Exit codes: what went wrong, told apart so scripts and CI jobs can branch on it (docs/cli.md)."""

from __future__ import annotations

OK = 0
FIRING = 1  # `check`: a critical alert fires and nobody acknowledged it
USAGE = 2  # bad arguments (argparse's own code), or no server URL
UNREACHABLE = 3  # no answer from the server (refused, timed out, name unknown), or the live feed dropped
UNAUTHENTICATED = 4  # 401: no token or login, a bad token, an expired login, a failed login
FORBIDDEN = 5  # 403: authenticated, but not allowed (e.g. a project token acknowledging)
NOT_FOUND = 6  # 404: no such run or alert among yours (another project's is the same 404)
REFUSED = 7  # another 4xx: the server refused the input (e.g. a silence without a valid duration)
SERVER = 8  # 5xx, a redirect (never followed), or an answer that is not the API's JSON (a proxy's error page)
INTERRUPTED = 130  # Ctrl-C, as for any shell command


class CliError(Exception):
    """A failure to report in one line and exit with `code`."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def for_status(status: int) -> int:
    if status == 401:
        return UNAUTHENTICATED
    if status == 403:
        return FORBIDDEN
    if status == 404:
        return NOT_FOUND
    if 400 <= status < 500:
        return REFUSED
    return SERVER
