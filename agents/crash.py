"""What a rank_end says about the exception that ended the process: type, message, and where."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class Crash:
    reason: str  # "ExceptionType: message"
    exc_type: str
    where: str | None  # "dir/file.py:line function" of the innermost frame


def describe(exc: BaseException) -> Crash:
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    where = None
    if frames:
        last = frames[-1]
        where = f"{_short(last.filename)}:{last.lineno} {last.name}"
    return Crash(f"{type(exc).__name__}: {exc}", type(exc).__name__, where)


def _short(path: str) -> str:
    """The last two components: enough to recognise the file, no install prefix or home dir."""
    parts = os.path.normpath(path).split(os.sep)
    return "/".join(parts[-2:])
