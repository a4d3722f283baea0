"""Run, rank, frame, alerts and compare pages plus the timeline / compare / ack / silence API,
on runs ingested through the real ingest endpoint and settled in-process."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard.detection.models import Alert, Silence
from dashboard.tenancy.models import Project, ProjectToken, Run
from tests.fixtures.pages_data import (
    FRAMES,
    GRAPH_MAJORITY,
    GRAPH_MINORITY,
    TORCH_211,
    Job,
    blob_hash,
    graph_blobs,
    job_batches,
    settle_all,
)

pytestmark = pytest.mark.django_db

XSS = "<script>window.pwned=1</script>"


def ingest(post, job: Job) -> Run:
    for batch in job_batches(job):
        response = post(batch)
        assert response.status_code == 200, response.content
    run = Run.objects.get(key=job.key)
    settle_all(run)
    return run


@pytest.fixture
def member(project) -> User:
    user = User.objects.create_user("mia", password="pw")
    project.members.add(user)
    return user


@pytest.fixture
def runs(post):
    new = ingest(
        post,
        Job(
            "job-213",
            grad_diverge=(2, 25),
            recompile=(1, 5),
            graph_frame=f"evil.py:1:{XSS}",
            recompile_reason=f"size mismatch {XSS}",
            name=f"name {XSS}",
        ),
    )
    old = ingest(post, Job("job-211", versions=dict(TORCH_211), fp_change_step=30, config_hash="cfg-11"))
    return new, old


@pytest.fixture
def logged_in(client, member):
    client.force_login(member)
    return client


def test_timeline_api_is_aggregated_and_shows_the_dissenting_rank(logged_in, runs):
    body = logged_in.get("/api/v1/runs/job-213/timeline").json()
    assert body["world_size"] == 4 and body["duration"] > 0
    ranks = {s[0] for s in body["spans"]}
    assert ranks == {0, 1, 2, 3}
    assert {s[3] for s in body["spans"]} >= {"hit", "miss"}
    assert [m[0] for m in body["markers"]["recompiles"]] == [1]
    assert {m[0] for m in body["markers"]["graph_breaks"]} == {0, 1, 2, 3}
    heat = body["heatmap"]
    assert heat["step_lo"] == 0 and heat["bins"] == 40
    assert {r for _, r, _ in heat["cells"]} == {2}
    assert min(b for b, _, _ in heat["cells"]) * heat["step_width"] == 25


def test_timeline_api_auth_contract(client, runs, token):
    assert client.get("/api/v1/runs/job-213/timeline").status_code == 401
    assert client.get("/api/v1/runs/nope/timeline", HTTP_AUTHORIZATION=f"Bearer {token}").json()["error"]
    assert client.get("/api/v1/runs/nope/timeline", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 404
    other = ProjectToken.issue(Project.objects.create(name="other"))
    response = client.get("/api/v1/runs/job-213/timeline", HTTP_AUTHORIZATION=f"Bearer {other}")
    assert response.status_code == 404 and "error" in response.json()
    assert client.get("/api/v1/runs/job-213/timeline", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 200


def test_compare_api_diffs_versions_frames_and_fingerprints(client, runs, token):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    body = client.get("/api/v1/compare?runs=job-211,job-213", **auth).json()
    env = {row["field"]: row for row in body["environment"]}
    assert env["versions.torch"]["values"] == ["2.11.0+cu128", "2.13.0+cpu"] and not env["versions.torch"]["same"]
    assert env["versions.cuda"]["values"] == ["12.8", "unknown"] and env["env.OMP_NUM_THREADS"]["same"]
    assert env["config_hash"]["values"] == ["cfg-11", "cfg-7f3a"]
    s11, s13 = body["compile_summary"]
    assert (s11["graphs"], s13["graphs"]) == (3, 5) and s13["recompiles"] == 0.25 and s11["recompiles"] == 0
    assert 0 < s11["cache_hit_rate"] < 1 and s11["failures"] == 0
    assert body["fingerprints"] == [{"run": "job-213", "first_step": 30, "group": "ddp", "steps_compared": 40}]
    frames = {row["key"]: row for row in body["frames"]}
    assert frames["ddp_job.py:forward"]["graph_equal"] and frames["ddp_job.py:forward"]["label"].startswith(
        "demo/ddp_job.py:"
    )
    assert not frames[f"evil.py:{XSS}"]["graph_equal"] and frames[f"evil.py:{XSS}"]["cells"][0] is None
    assert len(body["step_times"]["job-213"]) == 40
    assert client.get("/api/v1/compare?runs=job-211", **auth).status_code == 400
    assert client.get("/api/v1/compare?runs=job-211,missing", **auth).status_code == 404


def test_pages_render_with_user_text_escaped(logged_in, runs):
    for url in (
        "/",
        "/runs/job-213/",
        "/runs/job-213/ranks/1/",
        "/alerts/?state=all",
        "/compare/?runs=job-211,job-213",
        f"/runs/job-213/frame/?f={FRAMES[0]}&i=1",
    ):
        response = logged_in.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert XSS not in html, url
    run_page = logged_in.get("/runs/job-213/").content.decode()
    assert "name &lt;script&gt;" in run_page and 'id="timeline"' in run_page
    compare_page = logged_in.get("/compare/?runs=job-211,job-213").content.decode()
    assert "2.11.0+cu128" in compare_page and "first differing step 30" in compare_page
    assert logged_in.get("/compare/?run=job-211&run=job-213").status_code == 200  # from the runs list checkboxes


def test_frame_page_shows_consensus_dissenters_and_a_diff(logged_in, runs):
    html = logged_in.get("/runs/job-213/frame/", {"f": f"evil.py:1:{XSS}"}).content.decode()
    assert "rank 0 (majority)" in html and "rank 1 (dissenter)" in html
    assert f'<span class="del">-dynamo graph (normalized): {blob_hash(GRAPH_MAJORITY)}' in html
    assert f'<span class="add">+dynamo graph (normalized): {blob_hash(GRAPH_MINORITY)}' in html


def test_frame_diff_includes_graph_text_once_uploaded(logged_in, runs, client, token):
    response = client.post(
        "/api/v1/blobs", graph_blobs(), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 200, response.content
    html = logged_in.get("/runs/job-213/frame/", {"f": f"evil.py:1:{XSS}"}).content.decode()
    assert '<span class="add">+    dropout = torch.nn.functional.dropout(relu, 0.1, True)</span>' in html
    assert '<span class="del">-def forward(self, L_x_: &quot;f32[16, 64][64, 1]cpu&quot;):</span>' in html
    recompile = logged_in.get("/runs/job-213/frame/", {"f": FRAMES[0]}).content.decode()
    assert "size mismatch &lt;script&gt;" in recompile
    diff = logged_in.get("/compare/frame/", {"runs": "job-211,job-213", "frame": "demo/ddp_job.py:forward"})
    assert diff.status_code == 200 and "torch 2.11.0+cu128" in diff.content.decode()


def test_ack_and_silence_forms_need_csrf_and_record_the_user(member, runs):
    alert = Alert.objects.filter(run__key="job-213").first()
    assert alert is not None
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(member)
    assert browser.post(f"/alerts/{alert.id}/ack/").status_code == 403  # no CSRF token
    page = browser.get("/alerts/?state=all")
    csrf = page.cookies["csrftoken"].value
    response = browser.post(f"/alerts/{alert.id}/ack/", {"csrfmiddlewaretoken": csrf, "next": "/alerts/"})
    assert response.status_code == 302
    alert.refresh_from_db()
    assert alert.acked_by == member and alert.acked_at is not None
    response = browser.post(
        "/silences/",
        {
            "csrfmiddlewaretoken": csrf,
            "run": "job-213",
            "kind": alert.kind,
            "hours": "1.5",
            "comment": "known flaky node",
        },
    )
    assert response.status_code == 302
    silence = Silence.objects.get()
    assert (silence.run.key, silence.kind, silence.author, silence.comment) == (
        "job-213",
        alert.kind,
        member,
        "known flaky node",
    )
    assert "silenced until" in browser.get("/alerts/?state=all").content.decode()
    browser.post(f"/silences/{silence.id}/expire/", {"csrfmiddlewaretoken": csrf})
    assert "silenced until" not in browser.get("/alerts/?state=all").content.decode()


def test_ack_and_silence_api(member, runs, token, client):
    alert = Alert.objects.filter(run__key="job-213").first()
    assert client.post(f"/api/v1/alerts/{alert.id}/ack", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 403
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(member)
    assert browser.post(f"/api/v1/alerts/{alert.id}/ack").status_code == 403
    csrf = browser.get("/alerts/").cookies["csrftoken"].value
    acked = browser.post(f"/api/v1/alerts/{alert.id}/ack", HTTP_X_CSRFTOKEN=csrf).json()
    assert acked["acked_by"] == "mia"
    made = browser.post(
        "/api/v1/silences",
        {"run": "job-213", "rank": 2, "hours": 1, "comment": "x"},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=csrf,
    )
    assert made.status_code == 201 and made.json()["rank"] == 2
    bad = browser.post(
        "/api/v1/silences", {"run": "job-213", "hours": 1}, content_type="application/json", HTTP_X_CSRFTOKEN=csrf
    )
    assert bad.status_code == 400 and "comment" in bad.json()["fields"]


def test_outsider_sees_and_acts_on_nothing(runs):
    outsider = Client()
    outsider.force_login(User.objects.create_user("oscar"))
    for url in (
        "/runs/job-213/",
        "/runs/job-213/ranks/0/",
        f"/runs/job-213/frame/?f={FRAMES[0]}",
        "/compare/?runs=job-211,job-213",
    ):
        assert outsider.get(url).status_code == 404, url
    assert outsider.get("/api/v1/runs/job-213/timeline").status_code == 404
    assert outsider.get("/api/v1/compare?runs=job-211,job-213").status_code == 404
    assert "job-213" not in outsider.get("/alerts/?state=all").content.decode()
    alert = Alert.objects.filter(run__key="job-213").first()
    assert outsider.post(f"/alerts/{alert.id}/ack/").status_code == 404
    assert outsider.post(f"/api/v1/alerts/{alert.id}/ack").status_code == 404
    assert outsider.post("/silences/", {"run": "job-213", "hours": 1, "comment": "x"}).status_code == 302
    assert not Silence.objects.exists()


def test_runs_list_filters(logged_in, runs):
    assert (
        b"job-211" in logged_in.get("/?torch=2.11").content and b"job-213" not in logged_in.get("/?torch=2.11").content
    )
    critical = logged_in.get("/?health=critical").content
    assert b"job-213" in critical and b"job-211" not in critical
    assert b"job-211" in logged_in.get("/?health=ok").content
    assert b"job-213" in logged_in.get("/?status=finished").content


def test_run_page_reads_right_without_a_rank_or_a_baseline(logged_in, post):
    """A baseline divergence concerns the whole run (no rank is the root): never "root: ranks". A run
    without a baseline offers a choice, not an unrelated run preselected beside "Baseline: none"."""
    from dashboard.detection import baseline

    ingest(post, Job("ref-run"))
    ingest(post, Job("other-run"))
    for batch in job_batches(Job("new-run", fp_change_step=10)):
        assert post(batch).status_code == 200
    new = Run.objects.get(key="new-run")
    baseline.choose(new, Run.objects.get(key="ref-run"))
    settle_all(new)
    page = logged_in.get("/runs/new-run/").content.decode()
    assert "root: the whole run" in page and "root: ranks" not in page
    assert "selected" in page.split('name="baseline"')[1].split("</select>")[0]  # the chosen baseline
    fresh = logged_in.get("/runs/other-run/").content.decode()
    select = fresh.split('name="baseline"')[1].split("</select>")[0]
    assert "Baseline: none" in fresh and '<option value="" selected disabled>choose a run</option>' in select
    assert select.count("selected") == 1
