"""What a rank_end says about the exception that ended the process: type, message, and where."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Any, TextIO


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


TAIL_CHARS = 4096


class StderrTail:
    """sys.stderr as it was, keeping the last TAIL_CHARS characters written through it: a script that
    exits on its own (argparse's `exit(2)`, a config check) says why only there, and rank_end carries it."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tail = ""

    def write(self, text: str) -> int:
        self._tail = (self._tail + text)[-TAIL_CHARS:]
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:  # everything else is the stream's own
        return getattr(self._stream, name)

    def last_words(self, lines: int = 3) -> str | None:
        """The last non-empty lines written, or None."""
        said = [line.strip() for line in self._tail.splitlines() if line.strip()]
        return "\n".join(said[-lines:]) or None
