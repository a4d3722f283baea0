"""Why a request cannot be served, said once by the service that knows, rendered by each door.

Services raise `Problem` instead of returning error values, so callers never inspect what came
back: the API answers it as `{"error": message}` (plus `"path"` when one input is at fault), pages
as a 404 or a message next to the form.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)
class Problem(Exception):
    """An HTTP status, a message fit to show the caller, and the input field at fault (if one)."""

    status: int
    message: str
    path: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)
