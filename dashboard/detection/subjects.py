"""Alert subjects: the third part of an alert's identity (run, kind, subject), spelled once.

A rule declares its subject (`@rule(..., subject=...)`) and its findings carry it; the lifecycle,
the baseline comparison and the pages look alerts up by the same helpers. A subject built from a
name (a frame, a group, a run key) is cut to the column where it is built (`text.fit_key`), so the
lookups and the write agree on it.
"""

from __future__ import annotations

import hashlib

from dashboard.detection.models import Alert
from dashboard.detection.text import fit_key

RUN = "run"  # about the run as a whole (ineffective compile)
HANG = "hang"  # ranks waiting in a collective for others (hang_forecast), run-wide
COMPILE_SHARE = "compile-share"  # compile time against wall time, run-wide


def frame(name: str) -> str:
    return _fit(f"frame:{name}")


def recompile_lookups(name: str) -> str:
    """The cache lookups of a frame's lone recompiles (cache_divergence): apart from the frame's split
    outcomes, so that the ranks of each stay precise."""
    return _fit(f"recompile-lookups:{name}")


def group(name: str) -> str:
    return _fit(f"group:{name}")


def nonfinite_everywhere(name: str) -> str:
    """NaN/Inf gradients on every rank of a group (the all-reduce spread them): apart from the group's
    divergences, as agreeing (all NaN) weights do not resolve it; finite gradients on every rank do."""
    return _fit(f"nonfinite-everywhere:{name}")


def rank(number: int) -> str:
    return f"rank:{number}"


def error(step: int | None, exc_type: str | None, reason: str) -> str:
    """An exception raised in a step, whichever ranks raised it: ranks that failed alike stay one
    alert however their reports arrive (an upload sends a spool rank by rank)."""
    digest = hashlib.sha256(f"{exc_type}\0{reason}".encode()).hexdigest()[:16]
    return f"error:{step}:{digest}"


def baseline(key: str, group_name: str) -> str:
    return _fit(f"{baseline_prefix(key)}{group_name}")


def baseline_prefix(key: str) -> str:
    """Every subject of a comparison against baseline run `key`."""
    return f"baseline:{key}:"


def _fit(subject: str) -> str:
    return fit_key(Alert, "subject", subject)
