"""Flight Recorder call sites name the user's line: the agent drops its own frames (its wrapper of
DDP's __init__) and keeps the first frame outside torch even under a deep torch stack, and the server
skips torch's and the agent's frames of dumps older agents sent. On the real dumps of
tests/fixtures/flight_recorder/ (a 3-rank gloo hang)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import agents
from agents import flight_recorder
from dashboard.detection import flight

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"
AGENT_WRAPPER = {"filename": os.path.join(os.path.dirname(agents.__file__), "grads.py"), "line": 56, "name": "__init__"}
USER = "make_flight_recorder_dumps.py:50 main"


def dumps() -> dict[int, dict]:
    return {r: json.loads((FIXTURES / f"rank_{r}.json").read_text())["dump"] for r in range(3)}


def with_agent_frame(dump: dict) -> dict:
    """The dump as an agent that sent its own frames did: its DDP wrapper between torch and the user."""
    dump = copy.deepcopy(dump)
    for entry in dump["entries"]:
        torch_frames = [f for f in entry["frames"] if "/torch/" in f["filename"]]
        entry["frames"] = torch_frames + [AGENT_WRAPPER] + entry["frames"][len(torch_frames) :]
    return dump


def test_the_server_skips_the_agents_frames_to_the_users_line():
    result = flight.analyze({r: with_agent_frame(d) for r, d in dumps().items()}, world_size=3)
    where = result["ranks"]["0"]["entered"]["where"]
    assert where.endswith(USER) and "agents" not in where


def test_the_agent_never_sends_its_own_frames():
    raw = with_agent_frame(dumps()[0])
    sent = flight_recorder.bounded(raw)
    names = [(f.filename, f.name) for e in sent.entries for f in e.frames]
    assert names and (AGENT_WRAPPER["filename"], "__init__") not in names
    assert any(f.endswith("make_flight_recorder_dumps.py") for f, _ in names)


def test_the_users_frame_survives_a_torch_stack_deeper_than_the_limit():
    entry = dumps()[0]["entries"][-1]
    torch_frame = next(f for f in entry["frames"] if "/torch/" in f["filename"])
    deep = [torch_frame] * 40 + [AGENT_WRAPPER] + [f for f in entry["frames"] if "/torch/" not in f["filename"]]
    kept = flight_recorder.call_site_frames(deep, 16)
    assert len(kept) == 16 and kept[:15] == [torch_frame] * 15
    assert f"{kept[-1]['filename']}:{kept[-1]['line']} {kept[-1]['name']}".endswith(USER)
    assert flight.user_frame(kept) is kept[-1]
