"""docs/alerts.md is what an on-call engineer reads at 3 a.m.: every registered kind has its row
there (severity, when it fires, typical causes, what to do) and its own test module."""

import re
from pathlib import Path

from dashboard.detection import rules
from dashboard.detection.rules import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


def _reference_rows() -> dict[str, list[str]]:
    rows = {}
    for line in (ROOT / "docs" / "alerts.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        kind = re.sub(r'^<a id="[^"]*"></a>', "", cells[0])  # a row opens with its kind's anchor
        if line.startswith("| ") and kind.startswith("`") and len(cells) >= 5:
            rows[kind.strip("`")] = cells[1:]
    return rows


def test_every_kind_has_a_reference_row_that_says_what_to_do():
    rules.load_all()
    rows = _reference_rows()
    for kind in {r.kind for r in REGISTRY}:
        assert kind in rows, f"{kind} has no row in docs/alerts.md"
        severity, fires_when, causes, action = rows[kind][:4]
        assert severity.startswith(("critical", "warning", "info")), (kind, severity)
        assert len(fires_when) > 20 and len(causes) > 20 and len(action) > 20, kind


def test_every_kind_has_its_own_test_module():
    rules.load_all()
    present = {p.stem for p in Path(__file__).parent.glob("test_*.py")}
    missing = sorted(r.kind for r in REGISTRY if f"test_{r.kind}" not in present)
    assert not missing, missing
