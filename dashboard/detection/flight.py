"""Flight Recorder: when `hang_forecast` fires, ask the ranks for their dumps and put torch's own
analysis of them in the alert (issue 15).

`analyze` hands the dumps to torch's analysis (`torch.distributed.flight_recorder`'s `build_db`, what
`torchfrtrace` runs), imported lazily (only Celery workers run it) and fed the very dicts its file
loader would build from torch's pickles, built here from the validated JSON the agents sent (the
server unpickles nothing). Two repairs before it runs, both for data torch itself would mishandle:
gloo records its process group's config under an empty name while its entries name the group
("0", "default_pg"), so the config is renamed to the name the entries use; and torch `eval`s a
`ranks` string that is not a list literal, so every `ranks` is re-written from parsed integers.
From torch's collectives it takes the first one that is not whole (ranks missing, or a mismatch and
its type); per rank it reports the last collective entered (the newest entry) and completed
(`pg_status`, or the newest completed entry), next to what the rank compiled at that moment.
"""

from __future__ import annotations

import ast
import copy
import logging
import pkgutil
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import msgspec
from django.conf import settings
from django.db import transaction

import agents
from agents import protocol
from dashboard.detection import lifecycle, text
from dashboard.detection.models import Alert
from dashboard.evidence import reads
from dashboard.ledger import flight as requests_of

log = logging.getLogger(__name__)

_ENTRY_DEFAULTS = msgspec.structs.asdict(protocol.FREntry(record_id=0))
COMPILE_WINDOW_S = 600.0  # compile events this long before a dump count as "of that moment"


def _ranks_of(text: object) -> list[int] | None:
    try:
        ranks = ast.literal_eval(text) if isinstance(text, str) else text
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(ranks, (list, tuple, set)) and all(isinstance(r, int) and not isinstance(r, bool) for r in ranks):
        return sorted(ranks)
    return None


def _prepared(rank: int, dump: dict[str, Any], world_size: int | None) -> tuple[dict[str, Any], list[str]]:
    """One rank's dump as torch's loader returns it (`fr_trace.read_dump`), repaired; and what was repaired."""
    notes = []
    entries = [
        {**_ENTRY_DEFAULTS, **e, "process_group": tuple(e.get("process_group") or ("", ""))[:2]}
        for e in dump.get("entries") or []
    ]  # the wire omits default values; torch reads every key
    config: dict[str, dict[str, Any]] = {}
    for name, c in (dump.get("pg_config") or {}).items():
        ranks = _ranks_of((c or {}).get("ranks"))
        if ranks is None:
            notes.append(f"rank {rank}: process group {name!r} has no readable ranks; left out")
            continue
        config[name] = {"name": (c or {}).get("name", name), "desc": (c or {}).get("desc", ""), "ranks": str(ranks)}
    used = {e["process_group"] for e in entries}
    missing = [(n, d) for n, d in sorted(used) if n not in config]
    spare = [n for n in config if n not in {u for u, _ in used}]
    if len(missing) == 1 and len(spare) == 1:  # gloo: config under "", entries under ("0", "default_pg")
        name, desc = missing[0]
        config[name] = {**config.pop(spare[0]), "name": name, "desc": desc}
        notes.append(f"rank {rank}: process group config {spare[0]!r} renamed {name!r} ({desc})")
        missing = []
    for name, desc in missing:
        if desc == "default_pg" and world_size:
            config[name] = {"name": name, "desc": desc, "ranks": str(list(range(world_size)))}
        else:
            entries = [e for e in entries if e["process_group"][0] != name]
            notes.append(f"rank {rank}: process group {name!r} has no config; its entries left out")
    for (
        name,
        c,
    ) in config.items():  # torch compares desc across ranks by config; the entries' desc is the one it matches on
        descs = {d for n, d in used if n == name}
        if len(descs) == 1:
            c["desc"] = next(iter(descs))
    return {
        "host_name": f"rank{rank}",
        "rank": rank,
        "entries": entries,
        "version": dump.get("version") or "",
        "pg_config": config,
    }, notes


def _names(c: Any) -> dict[str, Any]:  # a collective of torch's analysis
    return {"seq": c.collective_seq_id, "op": c.collective_name, "pg": c.pg_desc, "state": c.collective_state}


def analyze(dumps: dict[int, dict[str, Any]], world_size: int | None = None) -> dict[str, Any]:
    """torch's analysis of the ranks' dumps (rank -> `protocol.FRDump` as a dict) and what it says, per rank.

    Returns {"ranks": {rank: {entered, completed, entries, error}}, "mismatch": {...} | None,
    "collectives": n, "notes": [...], "error": str}."""
    result: dict[str, Any] = {"ranks": {}, "mismatch": None, "collectives": 0, "notes": [], "error": ""}
    details: dict[str, Any] = {}
    versions: Counter[Any] = Counter()
    for rank, dump in sorted(dumps.items()):
        result["ranks"][str(rank)] = _rank_facts(dump)
        if dump.get("error") or not dump.get("entries"):
            continue
        prepared, notes = _prepared(rank, dump, world_size)
        result["notes"] += notes
        details[f"rank{rank}"] = prepared
        versions[prepared["version"]] += 1
    if not details:
        result["error"] = (
            "no rank recorded a collective (Flight Recorder off: TORCH_FR_BUFFER_SIZE unset before init_process_group?)"
        )
        return result
    version = versions.most_common(1)[0][0]
    for key in [k for k, d in details.items() if d["version"] != version]:
        result["notes"].append(
            f"{key}: Flight Recorder format {details.pop(key)['version']} differs from {version}; left out"
        )
    try:
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig

        args = JobConfig().parse_args(["--allow-incomplete-ranks", "--mismatch_cap", "10"])
        logging.getLogger("Flight Recorder").setLevel(logging.WARNING)
        db = build_db(copy.deepcopy(details), args, version)
    except Exception as exc:  # torch's analysis refuses data it cannot pair up: say so, keep the per-rank facts
        result["error"] = f"torch's Flight Recorder analysis failed: {type(exc).__name__}: {exc}"[:2000]
        return result
    result["collectives"] = len(db.collectives)
    for c in db.collectives:
        if c.missing_ranks or c.mismatch_collectives or not c.pass_check:
            errors = {
                str(r): {**_names(m), "error": str(m.type_of_mismatch) if m.type_of_mismatch else ""}
                for r, m in sorted((c.mismatch_collectives or {}).items())
            }
            result["mismatch"] = {
                **_names(c),
                "expected_ranks": sorted(c.expected_ranks or ()),
                "missing_ranks": sorted(c.missing_ranks or ()),
                "mismatched": errors,
            }
            break
    return result


def _rank_facts(dump: dict[str, Any]) -> dict[str, Any]:
    entries = [e for e in dump.get("entries") or [] if not e.get("is_p2p")]
    newest = max(entries, key=lambda e: (e.get("collective_seq_id") or 0, e.get("record_id") or 0), default=None)
    facts: dict[str, Any] = {
        "entries": len(dump.get("entries") or []),
        "error": dump.get("error") or "",
        "entered": None,
        "completed": None,
    }
    if newest is not None:
        facts["entered"] = _entry_facts(newest)
    completed = None
    pg = (newest.get("process_group") or [""])[0] if newest else None
    status = (dump.get("pg_status") or {}).get(str(newest.get("pg_id") or 0)) if newest else None
    try:
        seq = int((status or {}).get("last_completed_collective", -1))
    except (TypeError, ValueError):
        seq = -1
    if seq >= 0:
        completed = next(
            (
                e
                for e in entries
                if (e.get("collective_seq_id") or 0) == seq and (e.get("process_group") or [""])[0] == pg
            ),
            {"collective_seq_id": seq, "profiling_name": "", "state": "completed", "process_group": [pg, ""]},
        )
    else:
        done = [e for e in entries if e.get("state") == "completed"]
        completed = max(done, key=lambda e: e.get("collective_seq_id") or 0, default=None)
    if completed is not None:
        facts["completed"] = _entry_facts(completed)
    return facts


def _entry_facts(e: dict[str, Any]) -> dict[str, Any]:
    pg = e.get("process_group") or ["", ""]
    user = user_frame(e.get("frames") or [])
    return {
        "seq": e.get("collective_seq_id"),
        "op": e.get("profiling_name") or "",
        "state": e.get("state") or "",
        "pg": f"{pg[0]}:{pg[1]}" if len(pg) > 1 and pg[1] else str(pg[0]),
        "where": f"{user['filename']}:{user.get('line', 0)} {user.get('name', '')}" if user else "",
    }


_AGENT_FILES = tuple(f"/agents/{m.name}.py" for m in pkgutil.iter_modules(agents.__path__))


def user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The collective's call site: the innermost frame that is neither torch's nor the Lockstep agent's
    (older agents sent their own DDP wrapper, `agents/grads.py ... __init__`, among the frames)."""

    def foreign(filename: str) -> bool:
        path = filename.replace("\\", "/")
        return "/torch/" in path or path.endswith(_AGENT_FILES) or path.startswith("<")

    return next((f for f in frames if not foreign(f.get("filename") or "")), None)


# --- the alert side ---------------------------------------------------------------------------------


def ask(alert: Alert, ranks: set[int]) -> bool:
    """A hang_forecast alert is news: ask every live rank for a dump (once per alert revision); the
    analysis runs when all have answered, or after LOCKSTEP_FR_WAIT with those that did."""
    return requests_of.ask(alert.run_id, ranks, alert.id, alert.revision)


def summarize(alert_id: int, revision: int) -> bool:
    """Analyse the dumps of one round of requests and put the summary in the alert; True when it changed."""
    reqs = requests_of.requests(alert_id, revision)
    if not reqs:
        return False
    with transaction.atomic():
        alert = Alert.objects.select_for_update().filter(id=alert_id).first()
        if alert is None or alert.state != Alert.State.FIRING:
            return False
        since = min(r.created_at for r in reqs)
        records = {}
        for r in reqs:
            rec = reads.latest_flight_record(alert.run_id, r.rank, since)
            if rec is not None:
                records[r.rank] = rec
        summary = analyze({rank: rec.dump for rank, rec in records.items()}, alert.run.world_size)
        summary.update(
            revision=revision,
            asked=[r.rank for r in reqs],
            answered=sorted(records),
            compiles={str(rank): compiles_at(alert.run_id, rank, rec.received) for rank, rec in records.items()},
        )
        summary["message"] = headline(summary)
        old = (alert.details or {}).get("flight_recorder") or {}
        if old.get("revision", -1) > revision or _same(old, summary):
            return False
        lifecycle.enrich(alert, {"flight_recorder": summary}, news=True)
        return True


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return {k: v for k, v in a.items() if k != "message"} == {k: v for k, v in b.items() if k != "message"}


def compiles_at(run_id: int, rank: int, at: datetime) -> dict[str, Any]:
    """What the rank compiled at the moment of its dump: its last compile_start and last finished compile
    within COMPILE_WINDOW_S before it, and whether that start is still running (no compile of its id yet)."""
    window = at - timedelta(seconds=COMPILE_WINDOW_S)
    start = reads.compile_start(run_id, rank, window, at)
    done = reads.compile_finished(run_id, rank, window, at + timedelta(seconds=5))
    out: dict[str, Any] = {"compiling": None, "last": None}
    if done:
        out["last"] = {
            "frame": done["frame"],
            "index": done["index"],
            "status": done["status"],
            "seconds": done["compile_time"],
            "reason": (done["recompile_reason"] or "")[:500],
        }
    if start and not (done and done["compile_id"] == start.get("compile_id")):
        out["compiling"] = {
            "frame": start.get("frame") or "",
            "compile_id": start.get("compile_id") or "",
            "reason": (start.get("reason") or "")[:500],
        }
    return out


def headline(summary: dict[str, Any]) -> str:
    """One line: who entered which collective and who did not (torch's mismatch), or why there is none."""
    m = summary.get("mismatch")
    error: str = summary.get("error") or ""
    if error and not m:
        return error
    if not m:
        return "Flight Recorder: torch's analysis found every recorded collective complete on the ranks that answered"
    missing = m.get("missing_ranks") or []
    entered = [
        r for r in m.get("expected_ranks") or [] if r not in missing and str(r) not in (m.get("mismatched") or {})
    ]
    head = f"Flight Recorder: {_ranks(entered)} entered {m['op']} #{m['seq']} of process group {m['pg']}"
    if missing:
        lasts = []
        for r in missing:
            facts = (summary.get("ranks") or {}).get(str(r)) or {}
            last = facts.get("entered")
            lasts.append(
                f"{_ranks([r])}'s last is #{last['seq']} {last['op']}" if last else f"{_ranks([r])} sent no dump"
            )
        head += f"; {_ranks(missing)} never did ({', '.join(lasts)})"
    for r, mm in (m.get("mismatched") or {}).items():
        head += f"; rank {r} entered {mm['op']} #{mm['seq']} instead ({mm['error']})"
    return head


def _ranks(ranks: Iterable[int]) -> str:
    listed = list(ranks)
    return text.ranks_text(listed) if listed else "no rank"


def wait_s() -> float:
    return settings.LOCKSTEP_FR_WAIT
