"""Text detection builds and stores: rank lists as ranges, and every value cut to its column.

A rank list spelled rank by rank grows with the run: 256 ranks that all recompiled made an incident
cause of 919 characters for a 600-character column, and the settle of every slot of that run failed
on it. Ranges keep the usual sets short ("ranks 0-255", "ranks 0-3, 7, 9-12"), `ranks_text` stops
after RANGES_SHOWN of them, and what is still too long is cut where it is built, to the column's
`max_length` as the model declares it (`fit`), or, for a value that identifies a row (an alert's
subject, an incident's cause), cut with a digest of the whole so that two long values stay apart
(`fit_key`).

Text that came from a training process (an exception's message, a compile's failure) is made
printable before it is stored (`printable`): a terminal's colour codes, carriage returns and other
control characters in an error (gloo's and NCCL's messages pass through C++ loggers that may add
them) would reach the page as empty boxes. So would a pictograph: gloo ends "Connection closed by
peer" with "GLHF! 🏖️", which a machine without a colour-emoji font draws as a box; pictographs
(symbols beyond the Basic Multilingual Plane) and the variation selectors that style them are dropped.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable

from django.db import models

ELLIPSIS = "…"
RANGES_SHOWN = 12  # a message names at most this many ranges of ranks, then how many ranks it left out
DIGEST_CHARS = 12
ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")  # CSI, OSC, 2-byte
UNPRINTABLE = frozenset({"Cc", "Cs", "Co", "Cn"})  # controls, lone surrogates, private use, unassigned
KEPT = "\n\t"
PICTOGRAPHS = frozenset({"So", "Sk"})  # beyond U+FFFF: emoji, their skin tones; drawn by emoji fonts only
VARIATION_SELECTORS = frozenset({"\ufe0e", "\ufe0f"})  # text / emoji presentation of the character before


def printable(value: str) -> str:
    """`value` without terminal escape sequences, control characters and pictographs (newlines and
    tabs stay; a carriage return ends its line), anything else no font can draw shown as "?"."""
    value = ANSI.sub("", value).replace("\r\n", "\n").replace("\r", "\n")
    return "".join(map(_shown, value))


def _shown(c: str) -> str:
    """What the page shows for one character of a training process's text."""
    category = unicodedata.category(c)
    if c in KEPT:
        return c
    if category == "Cc" or c in VARIATION_SELECTORS or (category in PICTOGRAPHS and ord(c) > 0xFFFF):
        return ""
    return "?" if category in UNPRINTABLE else c


def runs_of(ranks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct ranks as (first, last) runs of consecutive ranks."""
    out: list[tuple[int, int]] = []
    for r in sorted(set(ranks)):
        if out and r == out[-1][1] + 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return out


def _spell(runs: list[tuple[int, int]], sep: str) -> str:
    """Runs of three ranks or more as ranges; "1, 2" stays a pair."""
    parts: list[str] = []
    for first, last in runs:
        parts += [f"{first}-{last}"] if last - first >= 2 else list(map(str, range(first, last + 1)))
    return sep.join(parts)


def rank_ranges(ranks: Iterable[int], sep: str = ", ") -> str:
    """[0, 1, 2, 3, 7, 9] -> "0-3, 7, 9" (every range: a grouping key must name the whole set)."""
    return _spell(runs_of(ranks), sep)


def parse_ranges(text: str, sep: str = ",") -> set[int]:
    """The inverse of `rank_ranges` ("0-3,7" -> {0, 1, 2, 3, 7}); a bare list ("0,1,2") reads the same."""
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(sep))):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def ranks_text(ranks: Iterable[int]) -> str:
    """ "rank 3", "ranks 0-1023", "ranks 0, 2, 4, … (+509 more)": bounded however many ranks."""
    runs = runs_of(ranks)
    count = sum(last - first + 1 for first, last in runs)
    head = "rank " if count == 1 else "ranks "
    if len(runs) <= RANGES_SHOWN:
        return head + _spell(runs, ", ")
    shown = runs[:RANGES_SHOWN]
    left = count - sum(last - first + 1 for first, last in shown)
    return head + _spell(shown, ", ") + f", {ELLIPSIS} (+{left} more)"


def max_length(model: type[models.Model], field: str) -> int:
    found = model._meta.get_field(field)
    assert isinstance(found, models.Field), f"{model.__name__}.{field} is a relation"
    length = found.max_length
    assert length is not None, f"{model.__name__}.{field} has no max_length"
    return length


def fit(model: type[models.Model], field: str, value: str) -> str:
    """`value` cut with an ellipsis to the column's length."""
    limit = max_length(model, field)
    return value if len(value) <= limit else value[: limit - len(ELLIPSIS)] + ELLIPSIS


def fit_key(model: type[models.Model], field: str, value: str) -> str:
    """`value` cut to the column's length, ending in a digest of the whole when cut: an identity
    (alert subject, incident cause) stays the same for the same value and apart for different ones."""
    limit = max_length(model, field)
    if len(value) <= limit:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:DIGEST_CHARS]
    return value[: limit - len(ELLIPSIS) - DIGEST_CHARS - 1] + f"{ELLIPSIS}#{digest}"
