"""Issue 39, item 7: bad input is a 4xx naming the field, never a 500. The cases that were 500s
(a NUL byte in a query parameter, a silence for rank 2^70, a baseline of "\\u0000", a 50,000-deep
JSON body), then a hypothesis fuzz over every route of dashboard/urls.py (GET and POST; fuzzed path
segments, query parameters and bodies; as a project member, with the project's token, and as
nobody), in process through Django's test client. The unknown websocket path is in
test_connections.py (it needs the real server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import quote, urlencode

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RoutePattern
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashboard.detection import lifecycle, silences
from dashboard.detection.models import Silence
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db
DEEP = "[" * 50_000 + "]" * 50_000


@pytest.fixture
def world(project, token, post):
    """A run with two ranks, an alert on rank 1 and a silence: real targets for the routes' ids."""
    for rank in (0, 1):
        assert post(make_batch(run="fuzz-run", rank=rank, world_size=2)).status_code == 200
    assert post(make_batch(run="fuzz-base", world_size=2)).status_code == 200
    run = Run.objects.get(project=project, key="fuzz-run")
    with transaction.atomic():
        alert = lifecycle.record(
            run, Finding("critical", (1,), "rank 1 diverged", step=0, kind="grad_divergence", subject="grad:ddp")
        )[0]
    silence = silences.create(
        project.id, run, kind="", rank=1, until=timezone.now() + timedelta(hours=1), comment="c", author=None
    )
    member = User.objects.create_user("fuzz-member", password="pw")
    project.members.add(member)
    session = Client()
    session.force_login(member)
    return {
        "project": project,
        "token": token,
        "session": session,
        "ids": {
            "key": "fuzz-run",
            "name": project.name,
            "rank": 1,
            "alert_id": alert.id,
            "incident_id": alert.incident_id,
            "silence_id": silence.id,
        },
    }


def _json_error(answer) -> dict:
    assert answer["Content-Type"] == "application/json", answer.content
    return answer.json()


# the 500s of the issue ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, field",
    [
        ("/?q=a\x00b", "q"),
        ("/?status=\x00", "status"),
        ("/alerts/?run=\x00", "run"),
        ("/alerts/?kind=k\x00", "kind"),
        ("/api/v1/compare?runs=a\x00,b", "runs"),
        ("/compare/?runs=a\x00,b", "runs"),
        ("/runs/fuzz-run/frame/?f=\x00", "f"),
        ("/api/v1/runs/a%00b", "key"),
        ("/runs/a%00b/", "key"),
    ],
)
def test_a_nul_byte_in_a_query_parameter_or_a_path_segment_is_a_400_naming_it(world, url, field):
    answer = world["session"].get(url)
    assert answer.status_code == 400
    assert _json_error(answer) == {"error": f"{field} contains a NUL byte", "path": field}


def test_a_nul_byte_in_a_cookie_is_a_400_before_the_session_is_looked_up(world):
    client = Client()
    client.cookies["sessionid"] = "abcdefgh\x00ijkl"
    answer = client.get("/")
    assert answer.status_code == 400 and _json_error(answer)["path"] == "sessionid"


def test_a_silence_for_rank_2_to_the_70_is_a_400_naming_the_rank(world):
    far = {"rank": 2**70, "hours": 1, "comment": "far", "run": "fuzz-run"}
    answer = world["session"].post("/api/v1/silences", json.dumps(far), content_type="application/json")
    assert answer.status_code == 400
    assert "rank" in _json_error(answer)["fields"]
    page = world["session"].post("/silences/", far, follow=True)
    assert page.status_code == 200 and "Silence not created: rank:" in page.content.decode()  # next to the form
    assert not Silence.objects.filter(comment="far").exists()


def test_a_rank_or_an_id_past_its_column_in_the_path_is_a_404(world):
    for url in ("/runs/fuzz-run/ranks/1180591620717411303424/", "/api/v1/alerts/1180591620717411303424/ack"):
        answer = world["session"].get(url) if "ranks" in url else world["session"].post(url)
        assert answer.status_code == 404, answer.content


def test_a_baseline_of_a_nul_is_a_400_naming_the_baseline(world):
    answer = world["session"].post(
        "/api/v1/runs/fuzz-run/baseline", json.dumps({"baseline": "\u0000"}), content_type="application/json"
    )
    assert answer.status_code == 400
    assert _json_error(answer)["path"] == "baseline"


@pytest.mark.parametrize("url", ["/api/v1/runs/fuzz-run/baseline", "/api/v1/silences", "/api/v1/alerts/1/resolve"])
def test_a_50000_deep_json_body_is_a_400(world, url):
    answer = world["session"].post(url, DEEP, content_type="application/json")
    assert answer.status_code == 400
    assert _json_error(answer)["path"] == "body"


# every route, fuzzed -----------------------------------------------------------------------------


def _routes(patterns=None, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(route, pattern) for every URL pattern Django serves, admin's included."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            yield from _routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry.pattern


ROUTES = sorted(_routes(), key=lambda route: route[0])
OWN = [route for route in ROUTES if not route[0].startswith("admin/")]  # admin's many routes: a share, not most
QUERY_NAMES = ["q", "project", "torch", "health", "status", "verdict", "page", "run", "runs", "kind", "severity"]
QUERY_NAMES += ["state", "acked", "tol", "f", "i", "frame", "next"]
TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["fuzz-run", "fuzz-base", "fuzz-run,fuzz-base", "nan", "-inf", "1e308", "\x00", "%00"]),
    st.integers(-(2**80), 2**80).map(str),
)
FIELDS = ["baseline", "reason", "rank", "hours", "comment", "run", "kind", "project", "next", "username", "password"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**80), 2**80) | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=8,
)


def _segment(name: str, ids: dict) -> st.SearchStrategy[str]:
    real = st.just(str(ids[name])) if name in ids else st.nothing()
    if name in ("alert_id", "incident_id", "silence_id", "rank"):
        return real | st.integers(0, 2**80).map(str)
    return real | st.text(min_size=1, max_size=12).filter(lambda t: "/" not in t).map(lambda t: quote(t, safe=""))


@st.composite
def requests_(draw, ids: dict) -> tuple[str, str, str, object, str]:
    """(method, url, who, body, content type): a route with its parameters filled, fuzzed query and body."""
    route, pattern = draw(st.sampled_from(OWN) | st.sampled_from(ROUTES))
    if isinstance(pattern, RoutePattern):
        path = route
        for name in pattern.converters:
            start = path.index("<")
            path = path[:start] + draw(_segment(name, ids)) + path[path.index(">", start) + 1 :]
    else:
        path = quote(draw(st.from_regex(route.replace("^", "").replace("$", ""), fullmatch=True)), safe="/")
    query = draw(st.dictionaries(st.sampled_from(QUERY_NAMES) | st.text(max_size=5), TEXT, max_size=4))
    url = "/" + path + ("?" + urlencode(query) if query else "")
    method = draw(st.sampled_from(["GET", "POST"]))
    kind = draw(st.sampled_from(["json", "form", "bytes", "deep"]))
    body: object = {
        "json": lambda: json.dumps(draw(JSON)),
        "form": lambda: urlencode(
            draw(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), TEXT, max_size=4))
        ),
        "bytes": lambda: draw(st.binary(max_size=64)),
        "deep": lambda: DEEP,
    }[kind]()
    content_type = "application/x-www-form-urlencoded" if kind == "form" else "application/json"
    return method, url, draw(st.sampled_from(["member", "token", "nobody"])), body, content_type


def test_no_route_answers_a_5xx_to_any_input(world):
    nobody = Client()

    @settings(
        max_examples=600,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
    )
    @given(requests_(world["ids"]))
    def fuzz(request: tuple[str, str, str, object, str]) -> None:
        method, url, who, body, content_type = request
        client = world["session"] if who == "member" else nobody
        extra = {"HTTP_AUTHORIZATION": f"Bearer {world['token']}"} if who == "token" else {}
        with transaction.atomic():  # each example from the same data, and a database error cannot poison the next
            if method == "GET":
                answer = client.get(url, **extra)
            else:
                answer = client.generic("POST", url, body, content_type=content_type, **extra)
            transaction.set_rollback(True)
        assert answer.status_code < 500, (method, url, who, str(body)[:200], answer.status_code)

    fuzz()
