"""`lockstep check` without a run key (issue 52, item 5): the newest run the caller sees, as a CI job
with the agent's generated key has no other way to name it; refused when those runs are of several
projects (a guess could pass CI on someone else's run)."""

from __future__ import annotations

import pytest

from lockstep_cli import exits
from lockstep_cli.exits import CliError
from lockstep_cli.main import check_cmd, parser

CLEAN = {"verdict": {"kind": "in_lockstep", "text": "in lockstep"}}


class Api:
    """The read API as `check` asks it: the runs list (newest first), a run, its incidents."""

    def __init__(self, runs: list[dict]) -> None:
        self.runs, self.asked = runs, []

    def get(self, path: str, **params: str) -> dict:
        self.asked.append(path)
        if path == "/runs":
            return {"runs": self.runs}
        return {"incidents": []} if path.endswith("/incidents") else CLEAN


def check(api: Api, *argv: str) -> int:
    return check_cmd(api, parser().parse_args(["check", *argv]), False)  # type: ignore[arg-type]


def test_check_without_a_key_checks_the_newest_run(capsys):
    api = Api([{"key": "job-2a14b64214019811", "project": "team"}, {"key": "job-older", "project": "team"}])
    assert check(api) == exits.OK
    assert api.asked == ["/runs", "/runs/job-2a14b64214019811", "/runs/job-2a14b64214019811/incidents"]
    assert capsys.readouterr().out.startswith("job-2a14b64214019811: in lockstep")


def test_a_named_run_is_checked_without_listing_runs():
    api = Api([])
    assert check(api, "job-4711") == exits.OK
    assert api.asked == ["/runs/job-4711", "/runs/job-4711/incidents"]


@pytest.mark.parametrize(
    ("runs", "code", "said"),
    [
        ([{"key": "a", "project": "one"}, {"key": "b", "project": "two"}], exits.USAGE, "name the run"),
        ([], exits.NOT_FOUND, "no run to check"),
    ],
    ids=["several-projects", "no-run"],
)
def test_without_a_key_a_guess_is_refused(runs, code, said):
    with pytest.raises(CliError) as refused:
        check(Api(runs))
    assert refused.value.code == code and said in str(refused.value)
