"""Compare of two launches of one job says they are the same; a real setting change is named.

Three real torchrun launches of `tests/agents/tiny_ddp_job.py` under the agent, one rank each (compare
reads the environment, which is per launch), offline spools uploaded in-process: two identical but for
the hash seed (which once reordered the set-valued settings inside torch's config hash) and the
launcher's per-launch variables; one with `TORCHINDUCTOR_MAX_AUTOTUNE=1`. Runs stored by older agents,
with the per-launch variables and seed-ordered hashes in them, compare the same way (the recorded
`compare_213_spool.tgz`, launched twice)."""

from __future__ import annotations

import gzip
import json

import pytest

from agents.spool import list_batches
from tests.agents import tiny_jobs
from tests.agents.test_fixtures_ingest import _unpack, _upload

pytestmark = pytest.mark.django_db


def _compare(client, token, *keys: str) -> dict:
    response = client.get(f"/api/v1/compare?runs={','.join(keys)}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 200, response.content
    return response.json()


def _differing(body: dict) -> list[str]:
    return [row["field"] for row in body["environment"] if not row["same"]]


def test_two_launches_of_one_job_compare_as_identical_and_a_setting_change_is_named(client, token, post, tmp_path):
    jobs = {
        "same-a": {"PYTHONHASHSEED": "1"},
        "same-b": {"PYTHONHASHSEED": "2"},
        "autotune": {"PYTHONHASHSEED": "1", "TORCHINDUCTOR_MAX_AUTOTUNE": "1"},
    }
    started = {key: tiny_jobs.start(tmp_path / key, key, ranks=1, **env) for key, env in jobs.items()}
    for key, job in started.items():
        tiny_jobs.finish(job)
        _upload(post, str(tmp_path / key))
    same = _compare(client, token, "same-a", "same-b")
    assert _differing(same) == [] and same["settings"] == []
    hashes = {row["field"]: row["values"] for row in same["environment"]}["config_hash"]
    assert hashes[0] == hashes[1]  # the agent's hash itself no longer follows the hash seed
    changed = _compare(client, token, "same-a", "autotune")
    assert [s["key"] for s in changed["settings"]] == ["env.TORCHINDUCTOR_MAX_AUTOTUNE"]
    assert changed["settings"][0]["values"] == ["", "1"]


def _relaunched(directory: str, run: str, seed: int) -> list[bytes]:
    """The spool's rank_start bodies (the environment compare reads) as another launch of the job would
    have sent them with the older agent: another run key and session, another launcher run id and
    error file, a seed-ordered hash."""
    bodies = []
    for path in list_batches(directory):
        with open(path, "rb") as f:
            raw = f.read()
        batch = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        if not any(event["t"] == "rank_start" for event in batch["events"]):
            continue
        batch["run"]["key"], batch["session"] = run, f"{batch['session']}-{seed}"
        for event in batch["events"]:
            if event["t"] == "rank_start":
                event["config_hash"] = f"{seed:032x}"
                event["env"]["TORCHELASTIC_RUN_ID"] = f"launch-{seed}"
                event["env"]["TORCHELASTIC_ERROR_FILE"] = f"/tmp/torchelastic_{seed}/error.json"
        bodies.append(json.dumps(batch).encode())
    return bodies


def test_runs_stored_by_older_agents_compare_as_identical(client, token, post, tmp_path):
    directory = _unpack("compare_213_spool.tgz", tmp_path / "spool")
    for run, seed in (("old-a", 1), ("old-b", 2)):
        for body in _relaunched(directory, run, seed):
            assert post(body).status_code == 200
    body = _compare(client, token, "old-a", "old-b")
    rows = {row["field"]: row for row in body["environment"]}
    assert _differing(body) == [] and body["settings"] == []
    assert not any(field.startswith("env.TORCHELASTIC_RUN_ID") or "ERROR_FILE" in field for field in rows)
    assert rows["config_hash"]["values"] == [f"{1:032x}", f"{2:032x}"]  # shown, but not a difference
