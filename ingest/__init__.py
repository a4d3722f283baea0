"""Ingest: the wire protocol's server side, validation, and the writers into PostgreSQL."""
