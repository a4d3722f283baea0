"""The CLI's tables: a long message is cut on a pipe, wrapped under its column on a terminal, and
printed whole with --wide (before, MESSAGE and REMEDY were cut with no way to read them but --json)."""

from __future__ import annotations

import pytest

from lockstep_cli import tables
from lockstep_cli.main import parser

MESSAGE = "rank 2 recompiled Net.forward alone at step 5: " + "tensor 'x' size mismatch at index 0. " * 4


@pytest.fixture(autouse=True)
def layout():
    yield tables.LAYOUT
    tables.LAYOUT.wide, tables.LAYOUT.columns = False, None


def rows() -> str:
    return tables.table(("id", "kind", "message"), [[7, "recompile_divergence", MESSAGE]])


def test_a_pipe_gets_one_line_per_row_cut_at_80():
    header, row = rows().splitlines()
    assert row.endswith("…") and len(row.split("  ")[-1]) == tables.MAX_CELL


def test_a_terminal_wraps_the_last_column_under_itself(layout):
    layout.columns = 100
    header, *lines = rows().splitlines()
    start = header.index("MESSAGE")
    assert len(lines) > 1 and all(len(line) <= 100 for line in lines)
    assert all(line[:start].strip() == "" for line in lines[1:])
    assert " ".join(line[start:] for line in lines).split() == " ".join(MESSAGE.split()).split()


def test_wide_prints_every_cell_whole_on_one_line(layout):
    layout.wide, layout.columns = True, 100
    header, row = rows().splitlines()
    assert row.endswith(" ".join(MESSAGE.split()))
    long_kind = tables.table(("kind", "x"), [["k" * 120, 1]])
    assert "k" * 120 in long_kind


def test_too_narrow_a_terminal_cuts_rather_than_wraps(layout):
    layout.columns = 40
    assert rows().splitlines()[1].endswith("…")


@pytest.mark.parametrize("argv", [["--wide", "alerts", "r"], ["alerts", "r", "-w"]])
def test_wide_is_taken_before_or_after_the_command(argv):
    assert parser().parse_args(argv).wide is True
