"""Record what the real agent sends: a small torch.compile CPU training job, offline spool.

`python -m bench ingest_record` writes bench/data/agent-events.json (committed), which
bench/ingest.py replays as the template of every simulated rank: the recorded compile burst
(compile, graph_break, rank_start events) and the recorded steady per-step events.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import tempfile
from pathlib import Path

from bench.results import markdown, record, rerun

OUT = Path(__file__).resolve().parent / "data" / "agent-events.json"


def train(steps: int, spool: str) -> None:
    import torch

    import agents

    agent = agents.attach(run="bench-record", rank=0, world_size=1, offline=True, spool_dir=spool)
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # type: ignore[attr-defined]  # torch.compile's return type hides the module
    for i in range(steps):
        x = torch.randn(32 if i < steps // 2 else 16, 64)  # a batch-size change provokes a recompile
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    agent.close(timeout=30)


def read_spool(spool: str) -> list[dict]:
    events = []
    for name in sorted(os.listdir(spool)):
        raw = (Path(spool) / name).read_bytes()
        body = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        events.extend(body["events"])
    return events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as spool:
        train(args.steps, spool)
        events = read_spool(spool)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"recorded_with": "bench/ingest_record.py", "events": events}, indent=1))
    kinds: dict[str, int] = {}
    for e in events:
        kinds[e["t"]] = kinds.get(e["t"], 0) + 1
    print(f"wrote {OUT}: {kinds}")
    record(
        "ingest_record",
        markdown(("event type", "events"), sorted(kinds.items())),
        rerun("ingest_record", argv),
        f"The agent's events of a {args.steps}-step compiled CPU job, recorded into bench/data/agent-events.json.",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
