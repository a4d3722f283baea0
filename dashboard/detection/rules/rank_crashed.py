"""rank_crashed: a rank ended with an exception, an abort, a signal or a non-zero exit code. The
alert names the exception, where it was raised, the step it ended in, and the compile of that step
(its last compile): a crash right after loading a cached Inductor artifact points at the cache (a
foreign or stale entry), one right after compiling at the compiler, one with no compile in its step
at the model or the data.

Ranks that raise the same exception in the same step (a SyntaxError in the script, DDP's "Expected
to have finished reduction" on every rank), or exit by themselves with the same code and message
(argparse's exit 2 on a mistyped argument), failed for one cause: one alert names them all ("ranks
0, 1 raised the same error: ..."), under the subject of that error (`subjects.error`), never of a
rank: ranks whose reports come one after another (an upload, rank by rank) add to the one alert.

A crash is a root (paged for itself) or a consequence. A rank that lost its peer (gloo's connection
reset or closed by peer, NCCL's "remote process exited", a watchdog timeout, an aborted
communicator) or was stopped by a signal after another rank failed only suffered: its alert is
a warning that names the root rank (`details["consequence_of"]`), so the incident of that rank
holds it and nobody is paged about the innocent. The root is a rank that crashed on its own, or
a rank that went silent (killed outright: `rank_silent`). While no root is known, consequences
wait up to the grace window (`LOCKSTEP_CONSEQUENCE_GRACE`) for one to show; after it the first of
them carries a critical alert of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from dashboard.detection import subjects
from dashboard.detection.rules import (
    CompileFacts,
    Crash,
    Finding,
    RunView,
    cache_key,
    compile_outcome,
    ranks_text,
    rule,
    short_key,
)
from dashboard.detection.rules.rank_silent import silent_ranks
from dashboard.tenancy.models import VANISHED

RECENT_S = 60.0  # a compile outside the training steps this close before the end is "right before" it
MAX_REASON = 300  # characters of the exception message in the alert's message (all of it in details)
RANK_NUMBER = re.compile(r"\brank \d+", re.IGNORECASE)


LOST_PEER = re.compile(
    r"connection (reset|closed) by peer|remote process exited|watchdog caught collective|collective operation timeout"
    r"|communicator (was )?aborted|broken pipe|timed out waiting for|ncclRemoteError|peer (closed|disconnected)",
    re.IGNORECASE,
)


class LastCompile(CompileFacts):
    """The last compile, in the step the rank ended in, with its cache outcome and key."""

    outcome: str | None
    key: str


def is_signal(crash: Crash) -> bool:
    return crash["status"] == "signal"


def lost_peer(crash: Crash) -> bool:
    """The rank failed because another rank went away: what gloo and NCCL say then."""
    return bool(LOST_PEER.search(" ".join(filter(None, (crash.get("reason"), crash.get("exc_type"))))))


def is_consequence(crash: Crash) -> bool:
    return is_signal(crash) or lost_peer(crash)


def waiting(view: RunView, consequences: list[int]) -> bool:
    """Consequences with no root yet, still inside the grace window: say nothing yet."""
    first = min((view.crashes[r]["ended_at"] for r in consequences), default=None)
    return first is not None and view.now - first < view.grace


def how_it_ended(rank: int, crash: Crash) -> str:
    code = f", exit code {crash['exit_code']}" if crash["exit_code"] is not None else ""
    if crash["status"] == VANISHED:
        return f"Rank {rank}'s process vanished without a word, as the ranks on its node saw"
    if is_signal(crash):
        return f"Rank {rank} was stopped by {crash['reason'] or 'a signal'}{code}"
    if crash["reason"]:
        reason = crash["reason"] if len(crash["reason"]) <= MAX_REASON else crash["reason"][:MAX_REASON] + "…"
        return f"Rank {rank} crashed: {reason}" + (f" at {crash['where']}" if crash["where"] else "")
    if crash["status"] == "ok":
        return f"Rank {rank} exited with code {crash['exit_code']}"
    return f"Rank {rank} ended with status {crash['status']}{code}"


def raised_alike(group: list[int], crash: Crash) -> str:
    if not crash["reason"]:  # alike by their exit code alone (`same_error`)
        return f"{ranks_text(group).capitalize()} exited alike, with code {crash['exit_code']}"
    reason = crash["reason"] if len(crash["reason"]) <= MAX_REASON else crash["reason"][:MAX_REASON] + "…"
    where = f" at {crash['where']}" if crash["where"] else ""
    return f"{ranks_text(group).capitalize()} raised the same error: {reason}{where}"


def exited_on_its_own(crash: Crash) -> bool:
    """The script ended itself with a non-zero code (argparse's exit(2), a config check): no exception."""
    return crash["exc_type"] is None and (not crash["reason"] or crash["reason"].startswith("SystemExit"))


def in_progress(crash: Crash) -> int | None:
    """The step the rank ended in: one past its last completed step (its progress events arrive
    before its rank_end), or its last compile's when it completed none."""
    if crash["last_step"] is not None:
        return crash["last_step"] + 1
    return crash["last_compile"]["step"] if crash["last_compile"] else None


def just_before(crash: Crash, step: int | None) -> LastCompile | None:
    """The last compile, with its cache outcome and key, when it happened in the step the rank ended
    in (for a compile outside the training steps: within RECENT_S of the end); else None."""
    event = crash["last_compile"]
    if event is None:
        return None
    same_step = event["step"] == step if event["step"] is not None and step is not None else None
    if not (same_step if same_step is not None else event["seconds_before_end"] <= RECENT_S):
        return None
    return {**event, "outcome": compile_outcome(event["cache"]), "key": cache_key(event["cache_keys"])}


def doing(event: LastCompile) -> str:
    """What the rank did right before it ended, in words."""
    frame, key = event["frame"], short_key(event["key"]) if event["key"] else ""
    if event["status"] != "ok":
        return f"while compiling frame {frame} (compile #{event['index']}, {event['status']})"
    if event["outcome"] == "hit":
        return f"right after loading cached Inductor artifact {key} of frame {frame}"
    return f"right after compiling frame {frame}" + (
        f" (cache {event['outcome']}, key {key})" if event["outcome"] else ""
    )


def hint(crash: Crash, event: LastCompile | None) -> str:
    if crash["status"] == VANISHED:
        return (
            "Killed outright (SIGKILL, the kernel's OOM killer: see dmesg on its node) or crashed in native "
            "code (a segfault): torchrun's log names its exit code."
        )
    if is_signal(crash):
        return (
            "Stopped from outside (torchrun after another rank failed, the scheduler's time limit, or a user): "
            "read the launcher's log."
        )
    if event is None and exited_on_its_own(crash):
        return (
            f"The script exited by itself with code {crash['exit_code']} (argparse, a config or environment "
            "check): the message is what it printed last on stderr; fix the command line or the configuration."
        )
    if event is None:
        return (
            "No compile just before it: read the traceback at the named frame (model code, data, out of memory); "
            "the other ranks wait in their next collective until the timeout or torchrun stops them."
        )
    if event["outcome"] == "hit":
        return (
            "It crashed right after loading a cached artifact: if the cache dir is shared across node types, the "
            "entry may be another rank's (see rank_specific_artifact on this frame). Rerun with a fresh "
            "TORCHINDUCTOR_CACHE_DIR or TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 to confirm."
        )
    return (
        "It crashed in or right after a fresh compile: rerun with torch.compile(backend='aot_eager') to tell a "
        "compiler bug from a model bug, and TORCH_LOGS=output_code (or tlparse) to read the generated code."
    )


def _finding(view: RunView, group: list[int], collateral: list[int]) -> Finding:
    """One alert for ranks that failed alike, about its first (`group[0]`), which names it."""
    rank = group[0]
    crash = view.crashes[rank]
    step = in_progress(crash)
    event = just_before(crash, step)
    after = f"; {ranks_text(collateral)} then lost it or were stopped" if collateral else ""
    return Finding(
        severity="critical",
        subject=crash_subject(crash, step) or subjects.rank(rank),
        ranks=tuple(sorted(group)),
        step=step,
        frame=event["frame"] if event else None,
        message=(how_it_ended(rank, crash) if len(group) == 1 else raised_alike(group, crash))
        + (f" (step {step})" if step is not None else "")
        + (f", {doing(event)}" if event else "")
        + after,
        details={
            **_facts(crash, event),
            "stopped_after": collateral,
            "hint": hint(crash, event),
            **({"alike": sorted(group)} if len(group) > 1 else {}),
        },
    )


def _consequence(view: RunView, rank: int, root: int) -> Finding:
    crash = view.crashes[rank]
    step = in_progress(crash)
    why = "lost its connection to" if lost_peer(crash) else "was stopped after"
    return Finding(
        severity="warning",
        subject=subjects.rank(rank),
        ranks=(rank,),
        step=step,
        message=f"{how_it_ended(rank, crash)}: it {why} rank {root}, where the trouble started",
        details={
            **_facts(crash, None),
            "consequence_of": root,
            "hint": f"A consequence, not a cause: look at rank {root}.",
        },
    )


def _facts(crash: Crash, event: LastCompile | None) -> dict[str, Any]:
    return {
        "status": crash["status"],
        "exit_code": crash["exit_code"],
        "reason": (crash["reason"] or "")[:4000] or None,
        "exc_type": crash["exc_type"],
        "where": crash["where"],
        "ended_at": crash["ended_at"],
        "last_step": crash["last_step"],
        "last_compile": event or crash["last_compile"],
    }


def same_error(crash: Crash, step: int | None) -> tuple[str | None, str, int | None] | None:
    """What makes crashes of several ranks one cause: the exception (type, and message with the rank
    numbers it names made alike: DDP's "did not receive grad for rank 1") and the step it ended in.
    An end without an exception message is alike by its exit code (every rank exiting 2 the same way);
    None for a signal or a vanished process."""
    if crash["status"] not in ("error", "abort"):
        return None
    if crash["reason"]:
        return crash["exc_type"], RANK_NUMBER.sub("rank N", crash["reason"]), step
    return (None, f"exit code {crash['exit_code']}", step) if crash["exit_code"] is not None else None


def crash_subject(crash: Crash, step: int | None) -> str | None:
    """The subject of an exception's alert (`subjects.error`); None for an end without one."""
    key = same_error(crash, step)
    return subjects.error(step, key[0], key[1]) if key is not None else None


def declared(view: RunView) -> list[str]:
    """Every subject the rule may speak of in this run: each rank's, and each exception's."""
    errors = (crash_subject(c, in_progress(c)) for c in view.crashes.values())
    return [*(subjects.rank(r) for r in view.crashes), *sorted({s for s in errors if s})]


def alike(view: RunView, ranks: list[int]) -> list[list[int]]:
    """The ranks grouped by `same_error`, each group led by the rank that ended first (whose alert, and
    so whose incident, came first): a script every rank runs alike fails alike, and that is one cause."""
    first = sorted(ranks, key=lambda r: (view.crashes[r]["ended_at"], r))
    groups: dict[object, list[int]] = {}
    for rank in first:
        key = same_error(view.crashes[rank], in_progress(view.crashes[rank]))
        groups.setdefault(key if key is not None else ("rank", rank), []).append(rank)
    return sorted(groups.values(), key=lambda g: min(g))


@rule("rank_crashed", RunView, subject=declared)
def rank_crashed(view: RunView) -> Iterator[Finding]:
    if not view.crashes:
        return
    own = sorted(r for r, c in view.crashes.items() if not is_consequence(c))
    causes = own or sorted(silent_ranks(view))
    followers = sorted(r for r in view.crashes if r not in own)
    if not causes and (not followers or waiting(view, followers)):
        return
    if not causes:  # nobody else to blame after the grace window: the first to fail leads
        first = min(followers, key=lambda r: (view.crashes[r]["ended_at"], r))
        own, followers = [first], [r for r in followers if r != first]
        causes = own
    groups = alike(view, own)
    for group in groups:
        yield _finding(view, group, followers)
    root = next((g[0] for g in groups if causes[0] in g), causes[0])
    for rank in followers:
        yield _consequence(view, rank, root)
