"""Figures have one home. The targets are `TARGETS` (bench/results.py) and the README's benchmark
table is exactly that table; bench/README.md names each bench's ids, never a second copy of a
target; and a doc that names a bench (`python -m bench NAME` or its id) quotes a figure only when
that bench's sections of bench/RESULTS.md hold it, or when the doc dates it as history. Two copies
of a figure drift apart (a README at 0.85-0.92x beside results at 0.66x): this keeps one."""

from __future__ import annotations

import re

from bench import results
from bench.__main__ import benches
from tests.stack import ROOT

DOCS = (ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md")))
FIGURE = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?)(?:-(\d[\d,]*(?:\.\d+)?))?\s?(x|%|ms|s|GB/s|TB/s|B|k/s)(?![\w/])")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
BENCH_COMMAND = re.compile(r"python -m bench (\w+)")
IDS: dict[str, set[str]] = {}
for _id, _measure, _target, _command in results.TARGETS:
    IDS.setdefault(_id, set()).add(_command.split()[3])
BENCH_ID = re.compile(r"\b(" + "|".join(sorted(IDS)) + r")\b")
TARGET_TEXT = " ".join(t for _, _, t, _ in results.TARGETS)


def _blocks(text: str) -> list[str]:
    """Paragraphs, list items and table rows: the unit a figure and its bench share."""
    return [b for b in re.split(r"\n\s*\n|\n(?=\s*[|-] )", text) if b.strip()]


def _named_benches(block: str) -> set[str]:
    return set(BENCH_COMMAND.findall(block)) | {b for i in BENCH_ID.findall(block) for b in IDS[i]}


def _sections(results_text: str) -> dict[str, str]:
    """RESULTS.md's text per bench (a bench's sections together: `fingerprint` and `fingerprint (H200)`)."""
    found: dict[str, str] = {}
    parts = re.split(r"^## ", results_text, flags=re.MULTILINE)[1:]
    for part in parts:
        name = part.split(None, 1)[0]
        found[name] = found.get(name, "") + part
    return found


def unheld(doc_text: str, results_text: str) -> list[tuple[str, str]]:
    """(figure, the start of its block) for every undated figure quoted beside a bench whose results
    do not hold it: each of its numbers must appear in one of the named benches' sections, or in a target."""
    sections = _sections(results_text)
    bad = []
    for block in _blocks(doc_text):
        named = _named_benches(block)
        if not named or DATE.search(block):
            continue
        held = set(NUMBER.findall(" ".join(sections.get(b, "") for b in named)))
        for match in FIGURE.finditer(block):
            numbers = [n for n in match.group(1, 2) if n]
            if match.group(0) in TARGET_TEXT or all(n in held for n in numbers):
                continue
            bad.append((match.group(0), block.strip()[:80]))
    return bad


def test_the_readmes_benchmark_table_is_the_targets():
    rows = [(i, measure, target, f"`{command}`") for i, measure, target, command in results.TARGETS]
    assert results.markdown(("id", "measure", "target", "rerun"), rows) in (ROOT / "README.md").read_text()


def test_bench_readme_lists_every_bench_with_ids_that_have_targets_and_no_targets_of_its_own():
    rows = [line for line in (ROOT / "bench" / "README.md").read_text().splitlines() if line.startswith("| `")]
    listed = {}
    for row in rows:
        bench, ids, _measures = (cell.strip() for cell in row.strip()[1:-1].split("|"))
        listed[bench.strip("`")] = {i.strip() for i in ids.split(",") if i.strip()}
    assert sorted(listed) == benches()
    assert set().union(*listed.values()) <= set(IDS)
    for target_id, measured_by in IDS.items():
        assert all(target_id in listed[bench] for bench in measured_by), (target_id, measured_by)


def test_no_doc_quotes_a_figure_the_results_do_not_hold():
    results_text = results.RESULTS.read_text()
    quoted = {doc.relative_to(ROOT).as_posix(): unheld(doc.read_text(), results_text) for doc in DOCS}
    assert {doc: bad for doc, bad in quoted.items() if bad} == {}


def test_the_guard_tells_a_held_figure_from_a_stale_one():
    """What the guard above would catch: an undated figure the results lack, beside the bench's id
    or command; not a figure the results hold, a target, or one dated as history."""
    results_text = "## fingerprint\n\n| cpu | agent | 14.3 | 40.5 | 0.57 |\n\n## pages\n\n| p50 | 120 ms |\n"
    stale = "P3 on this CPU is 0.85-0.92x of `sum()`.\n\n`python -m bench pages`: 95 ms at 1024 ranks.\n"
    assert [f for f, _ in unheld(stale, results_text)] == ["0.85-0.92x", "95 ms"]
    fine = (
        "P3 on this CPU: 0.57x (target >= 0.75x).\n\n"
        "`python -m bench pages`: 120 ms.\n\n"
        "On 2026-11-30 P3 was 0.85-0.92x.\n\n"
        "A flush every 0.5 s, no bench named.\n"
    )
    assert unheld(fine, results_text) == []
