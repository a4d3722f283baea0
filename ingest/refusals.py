"""Why a request cannot be served: one error type, raised by whichever layer knows, rendered by each door.

Code that refuses raises `Refusal` instead of returning error values, so callers never inspect
what came back: the agents' endpoints and the read API answer it as `{"error": message}` (plus
`"path"` when one input is at fault), pages as a 404 or a message next to the form. It lives in
`ingest`, below `dashboard.web` in the import layers (`.importlinter`), so both may raise it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)
class Refusal(Exception):
    """An HTTP status, a message fit to show the caller, and the input field at fault (if one)."""

    status: int
    message: str
    path: str | None = None
    retry_after: int | None = None  # seconds, where the refuser knows when trying again helps (a 429)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def within(self, prefix: str) -> Refusal:
        """The same refusal, its path inside `prefix` (a bulk request's `batches[i]`)."""
        self.path = f"{prefix}.{self.path}" if self.path else prefix
        return self
