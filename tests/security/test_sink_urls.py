"""Destination URLs are someone's input (issue 29, item 10): loopback, private and link-local
addresses are refused when saved and, after DNS resolution, when sent, unless
LOCKSTEP_SINKS_ALLOW_PRIVATE is set; redirects are not followed; answers are read bounded, with
deadlines. The receivers are local servers (the outside edge)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from dashboard.delivery import notifications, notify, outbound
from dashboard.delivery.models import Notification, Webhook
from dashboard.delivery.sinks.json import JsonWebhook
from dashboard.delivery.transports import TransportError
from dashboard.detection import lifecycle
from dashboard.detection.models import Incident
from dashboard.detection.rules import Finding
from dashboard.tenancy.models import Run
from tests.delivery.receivers import JsonReceiver

pytestmark = pytest.mark.django_db

PRIVATE = [
    "http://127.0.0.1:9093",
    "http://localhost:8080/hook",
    "http://10.0.0.5/",
    "http://192.168.1.1/x",
    "http://169.254.169.254/latest/meta-data",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://0.0.0.0/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
    "http://[64:ff9b::7f00:1]:9093/",  # NAT64 of 127.0.0.1
    "http://[64:ff9b:1::808:808]/",  # local-use NAT64: the operator's own translator
    "http://[2002:a00:5::1]/",  # 6to4 of 10.0.0.5
    "http://[2002:c0a8:101::]/",  # 6to4 of 192.168.1.1
    "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/",  # Teredo
    "http://[::7f00:1]/",  # IPv4-compatible 127.0.0.1
    "http://[::a9fe:a9fe]/",  # IPv4-compatible 169.254.169.254
    "http://[::ffff:0:7f00:1]/",  # SIIT's IPv4-translated 127.0.0.1
    "http://[::ffff:0:a00:5]/",  # SIIT's IPv4-translated 10.0.0.5
]


@pytest.fixture(autouse=True)
def private_sinks_allowed(settings):
    """The receivers listen on 127.0.0.1: allowed unless a test turns it off."""
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = True


@pytest.fixture
def receivers():
    made = [JsonReceiver(), JsonReceiver()]
    yield made
    for r in made:
        r.close()


@pytest.mark.parametrize("url", PRIVATE)
def test_a_private_destination_is_refused_when_saved(project, settings, url):
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = False
    with pytest.raises(ValidationError, match="LOCKSTEP_SINKS_ALLOW_PRIVATE"):
        Webhook(project=project, kind="json", url=url).clean()
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = True
    Webhook(project=project, kind="json", url=url).clean()
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = False
    Webhook(project=project, kind="json", url="https://93.184.215.14/hook").clean()  # a public address is fine
    Webhook(project=project, kind="json", url="https://[64:ff9b::5db8:d70e]/hook").clean()  # NAT64 of the same
    Webhook(project=project, kind="json", url="https://[2002:5db8:d70e::1]/hook").clean()  # 6to4 of the same
    Webhook(project=project, kind="json", url="https://[::ffff:0:5db8:d70e]/hook").clean()  # SIIT of the same
    with pytest.raises(ValidationError, match="http"):
        Webhook(project=project, kind="json", url="file:///etc/passwd").clean()


def test_a_private_destination_stored_anyway_is_refused_at_send_and_delivered_once_allowed(
    project, settings, receivers
):
    receiver = receivers[0]
    Webhook.objects.create(
        project=project, kind="json", url=receiver.url + "/in"
    )  # stored past clean (a row from before)
    run = Run.objects.create(project=project, key="urls", world_size=2)
    with transaction.atomic():
        lifecycle.apply(
            run, [Finding("critical", (1,), "rank 1 went silent", kind="rank_silent", subject="rank:1")], [], None
        )
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = False
    [note] = notify.deliver_incident(Incident.objects.get(run=run).id)[0]
    assert notifications.send(note) is False
    refused = Notification.objects.get(id=note)
    assert refused.state == "pending" and "non-public" in refused.last_error and receiver.requests == []
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = True
    later = timezone.now() + timezone.timedelta(minutes=1)
    assert notifications.due(later) == [note] and notifications.send(note, later)
    assert len(receiver.requests) == 1


def test_a_redirect_is_not_followed(receivers, project):
    first, elsewhere = receivers
    first.redirect_to = elsewhere.url + "/in"
    run = Run.objects.create(project=project, key="redirected", world_size=2)
    incident = Incident.objects.create(run=run, cause="ranks:1", severity="critical")
    with pytest.raises(TransportError, match="302: redirect to .* not followed"):
        JsonWebhook(Webhook(url=first.url + "/in")).notify(incident, "k")
    assert len(first.requests) == 1 and elsewhere.requests == []


def _raw_server(answer) -> tuple[str, socket.socket]:
    """A TCP server whose every connection is handled by `answer(conn)` (a receiver gone wrong)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}/in", server


def test_an_endless_answer_is_read_only_up_to_its_bound_and_a_silent_one_times_out(monkeypatch):
    def endless(conn: socket.socket) -> None:
        conn.recv(65536)
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            while True:
                conn.sendall(b"x" * 65536)
        except OSError:
            conn.close()

    def silent(conn: socket.socket) -> None:
        conn.recv(65536)
        time.sleep(5)
        conn.close()

    url, server = _raw_server(endless)
    started = time.monotonic()
    assert len(outbound.request("POST", url, b"{}").body) == outbound.MAX_ANSWER_BYTES
    assert time.monotonic() - started < 2
    server.close()
    monkeypatch.setattr(outbound, "TIMEOUT_S", 0.3)
    url, server = _raw_server(silent)
    started = time.monotonic()
    with pytest.raises(outbound.SendError, match="timed out"):
        outbound.request("POST", url, b"{}")
    assert time.monotonic() - started < 2
    server.close()


def test_a_name_is_tried_at_each_checked_address_and_an_environment_proxy_is_used(receivers, monkeypatch, settings):
    receiver, proxy = receivers
    port = receiver.url.rsplit(":", 1)[1]
    assert (
        outbound.request("POST", f"http://localhost:{port}/in", b"{}").status == 200
    )  # each resolved address tried in turn
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("no_proxy", "")
    outbound.request("POST", "http://hooks.example.invalid/in", b"{}")  # resolved by the proxy, not here
    assert [path for path, _, _ in proxy.requests] == ["http://hooks.example.invalid/in"]
    settings.LOCKSTEP_SINKS_ALLOW_PRIVATE = False
    with pytest.raises(outbound.Refused):  # a name that resolves here to a private address is refused, proxy or not
        outbound.request("POST", f"http://localhost:{port}/in", b"{}")
