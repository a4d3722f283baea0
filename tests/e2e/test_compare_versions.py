"""Issue 16's proof on real runs, in Chromium: one job (demo/compare_job.py, 2 ranks, CPU gloo)
recorded under torch 2.11 / python 3.12 (the GPU machine's image) and torch 2.13 / python 3.11
(here) by tests/fixtures/make_compare_fixtures.sh, both spools sent with `python -m agents upload`
to the real stack (uvicorn + Celery worker). The compare page aligns every frame under the user's
names, shows both versions, plots the loss and gradient-norm drift and names the settings.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.e2e.test_browser_pages import login, page, shot, team  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("live_db")]
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
V211, V213 = "compare-211", "compare-213"


def upload(stack, token: str, fixture: str, into: Path) -> None:
    with tarfile.open(FIXTURES / fixture) as tar:
        tar.extractall(into, filter="data")
    done = subprocess.run(
        [sys.executable, "-m", "agents", "upload", str(into), "--url", stack.url, "--token", token],
        capture_output=True,
        text=True,
        timeout=120,
        env=stack.env,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_two_torch_versions_of_one_job_side_by_side(stack, page, team, tmp_path):  # noqa: F811
    _, token, session = team
    upload(stack, token, "compare_211_spool.tgz", tmp_path / "211")
    upload(stack, token, "compare_213_spool.tgz", tmp_path / "213")
    login(page, stack, session)
    page.goto(f"{stack.url}/compare/?runs={V211},{V213}")
    page.wait_for_selector("#verdict")

    versions = page.locator("td.torch-version").all_inner_texts()
    assert versions == ["2.11.0+cu130", "2.13.0+cpu"]
    verdict = page.locator("ul.verdict-lines").inner_text()
    assert "2 of 2 frames aligned" in verdict and "loss within tolerance 0.001 through step 11" in verdict
    labels = page.locator("table.verdict-table td.frame-label").all_inner_texts()
    assert sorted(labels) == ["compare_job.py:46 Net.forward", "compare_job.py:50 loss_fn"]
    assert page.locator("table.verdict-table .absent").count() == 0
    assert page.locator("table.frames-table .absent").count() == 0

    # drift plotted: both runs' loss and gradient norm, and their relative difference
    for chart in ("#drift-loss", "#drift-grad", "#drift-rel"):
        page.wait_for_selector(f"{chart} canvas")
    assert page.get_attribute("#drift-loss", "data-series") == "2"
    assert page.get_attribute("#drift-grad", "data-series") == "2"
    shot(page, "compare-versions")
    drift = page.locator("ul.drift").inner_text()
    assert "first bitwise difference at step" in drift and "within tolerance through step 11" in drift

    # settings diffed: the ones that differ are listed, the equal compiler settings are one click away
    differing = page.locator("#settings th").all_inner_texts()[1:]
    assert "env.TORCH_TRACE" in differing and not [k for k in differing if k.startswith("settings.")]
    page.uncheck("#diff-only")
    same = page.locator("#env tr", has_text="settings.inductor.fallback_random")
    assert same.is_visible() and same.inner_text().split()[1:] == ["True", "True"]

    # a tighter tolerance from the page: the same drift now counts
    page.fill("#tolerance-form input[name=tol]", "0")
    page.click("#tolerance-form button[type=submit]")
    page.wait_for_selector("ul.drift")
    assert "drift exceeds 0.0 at step" in page.locator("ul.drift").inner_text()

    # graph diffs between the versions are one click away
    page.goto(f"{stack.url}/compare/?runs={V211},{V213}")
    page.locator("table.verdict-table a.graph-diff").first.click()
    page.wait_for_selector("h1.frame-name")
    assert "torch 2.11.0+cu130" in page.locator("p", has_text="lowest rank of each").inner_text()
