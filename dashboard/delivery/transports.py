"""Where an incident revision goes: one small class per kind of destination (healthchecks' transports).

A transport knows one receiver's wire format and nothing else: `notifications` decides what to
send, when, and records the outcome; a transport sends once and raises `TransportError` when the
receiver did not take it. Adding a sink means adding one `Transport` subclass with its own `kind`
(a `Webhook.Kind` value); subclasses register themselves in `TRANSPORTS`.

Only incidents page: one incident is one Slack message per revision, one Alertmanager alert, one
PagerDuty incident, one JSON document per revision, titled by its root (the alert where the trouble
started), its consequences folded into a short list. Text the agents supplied (messages, frames, run
keys) is bounded for every sink and, for Slack, escaped so that `<!channel>` or `<https://evil|link>`
arrives as inert text.

`notify` gets the receipt the previous sent revision to the same destination returned (empty the
first time) and returns this one's: Alertmanager needs it to end a label set it was given before
when the labels change (another root, a higher severity), PagerDuty to trigger before an
acknowledge it has no incident for.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar
from urllib.parse import quote

from django.conf import settings
from django.utils import timezone

from dashboard.delivery import outbound
from dashboard.delivery.models import Webhook
from dashboard.detection.models import Alert, Incident

TRANSPORTS: dict[str, type[Transport]] = {}  # kind -> class, filled by Transport.__init_subclass__
Receipt = dict[str, Any]
TEXT_MAX_CHARS = 3000  # a message, in any sink
SHORT_MAX_CHARS = 256  # a label, a title part, a frame
CONSEQUENCES_SHOWN = 10  # the folded list's length; the rest is "+N more"


class TransportError(Exception):
    """The receiver did not take the notification; the text is kept as `Notification.last_error`,
    `status` is the HTTP status where one came back."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Transport:
    """Sends an incident revision to one destination. `notify` raises `TransportError`, returns its receipt."""

    kind: ClassVar[str]

    def __init__(self, webhook: Webhook) -> None:
        self.webhook = webhook

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register by `kind`, so a new sink is one class and cannot silently shadow another."""
        super().__init_subclass__(**kwargs)
        if cls.kind in TRANSPORTS:
            raise TypeError(f"transport kind {cls.kind!r} is taken by {TRANSPORTS[cls.kind].__name__}")
        TRANSPORTS[cls.kind] = cls

    def notify(self, incident: Incident, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        """Send the incident as it is now; `idempotency_key` names the revision, the same on every retry."""
        raise NotImplementedError


class SlackWebhook(Transport):
    """Slack's incoming-webhook format (what "Slack-compatible" receivers accept): one message per
    incident revision, every text field escaped (`slack_escape`) and bounded."""

    kind = Webhook.Kind.SLACK.value
    COLORS = {"critical": "#c62828", "warning": "#ef8f00"}

    def notify(self, incident: Incident, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        _post_json(self.webhook.url, self.payload(incident, previous), {"Idempotency-Key": idempotency_key})
        return {}

    @classmethod
    def payload(cls, incident: Incident, previous: Receipt | None = None) -> dict:
        root, consequences = root_of(incident), consequences_of(incident)
        fields = [
            {"title": "ranks", "value": slack_escape(ranks_text(root.ranks)), "short": True},
            {"title": "step", "value": str(root.step if root.step is not None else "-"), "short": True},
        ]
        if root.frame:
            fields.append({"title": "frame", "value": slack_escape(root.frame, SHORT_MAX_CHARS), "short": False})
        if consequences:
            fields.append(
                {
                    "title": f"consequences ({len(consequences)})",
                    "value": slack_escape(folded(consequences)),
                    "short": False,
                }
            )
        return {
            "text": slack_escape(f"{status_word(incident)} {update_note(incident, previous)}{headline(incident)}"),
            "attachments": [
                {
                    "color": "#2e7d32"
                    if incident.state == Incident.State.RESOLVED
                    else cls.COLORS.get(incident.severity, "#ef8f00"),
                    "title": slack_escape(
                        f"{root.kind} · ranks {ranks_text(root.ranks)} · {incident.run.key}", SHORT_MAX_CHARS
                    ),
                    "title_link": _run_url(incident),
                    "text": slack_escape(root.message),
                    "fields": fields,
                }
            ],
            "lockstep": {"incident": incident.id, "revision": incident.revision},
        }


class Alertmanager(Transport):
    """Alertmanager's v2 API (`POST /api/v2/alerts`): one alert per incident, labelled `alertname` and
    `kind` (the root's kind), `project`, `run`, `incident` (its id), `severity`, `ranks` (the root's),
    so that routes, inhibitions and silences apply; `group_by: [project, run, incident]` keeps one
    notification per incident.

    Lockstep posts on change and re-sends a firing incident every REFRESH (`notifications.refresh`),
    so a firing one carries a short `endsAt` (HOLD): if Lockstep stops, Alertmanager resolves it
    within HOLD instead of holding a dead one for a day. A resolved one ends at its resolution. A
    label set that changed since the last send (re-rooted, escalated) is ended in the same request."""

    kind = Webhook.Kind.ALERTMANAGER.value
    PATH = "/api/v2/alerts"
    SILENCES = "/api/v2/silences"
    HOLD = timedelta(minutes=15)
    REFRESH = timedelta(minutes=5)

    def notify(self, incident: Incident, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        labels = self.labels(incident)
        body = [self.posted(incident, labels)]
        before = (previous or {}).get("labels")
        if before and before != labels:
            body.append(
                {"labels": before, "startsAt": _rfc3339(incident.opened_at), "endsAt": _rfc3339(timezone.now())}
            )
        _post_json(self.url(self.PATH), body, {"Idempotency-Key": idempotency_key})
        return {"labels": labels}

    def url(self, path: str) -> str:
        return self.webhook.url.rstrip("/") + path

    @staticmethod
    def labels(incident: Incident) -> dict[str, str]:
        """Empty values are left out (an empty label is no label to Alertmanager): a run-wide root has no ranks."""
        root = root_of(incident)
        labels = {
            "alertname": root.kind,
            "project": incident.run.project.name,
            "run": incident.run.key,
            "incident": str(incident.id),
            "kind": root.kind,
            "severity": incident.severity,
            "ranks": rank_ranges(root.ranks, SHORT_MAX_CHARS),
        }
        return {name: value[:SHORT_MAX_CHARS] for name, value in labels.items() if value}

    def posted(self, incident: Incident, labels: dict[str, str]) -> dict:
        root, consequences = root_of(incident), consequences_of(incident)
        resolved = incident.state != Incident.State.FIRING  # fixed, or the run ended first
        ends = (incident.resolved_at or timezone.now()) if resolved else timezone.now() + self.HOLD
        annotations = {
            "summary": headline(incident)[:SHORT_MAX_CHARS],
            "description": root.message[:TEXT_MAX_CHARS],
            "count": str(sum(a.count for a in members(incident))),
            "alerts": str(len(members(incident))),
        }
        if consequences:
            annotations["consequences"] = folded(consequences)
        if root.step is not None:
            annotations["step"] = str(root.step)
        if root.frame:
            annotations["frame"] = root.frame[:SHORT_MAX_CHARS]
        if incident.acked_by_id:
            annotations["acknowledged_by"] = incident.acked_by.get_username()[:SHORT_MAX_CHARS]
        out = {
            "labels": labels,
            "annotations": annotations,
            "startsAt": _rfc3339(incident.opened_at),
            "endsAt": _rfc3339(max(ends, incident.opened_at)),
        }
        if url := _incident_url(incident):
            out["generatorURL"] = url
        return out

    def silence(self, incident: Incident, until: datetime, silence_id: str, comment: str) -> str:
        """Create (or extend) the silence of this incident until `until`; its id. An id Alertmanager no
        longer knows (expired, deleted by hand) is replaced by a new silence."""
        body = {
            "matchers": [
                {"name": "project", "value": incident.run.project.name, "isRegex": False, "isEqual": True},
                {"name": "incident", "value": str(incident.id), "isRegex": False, "isEqual": True},
            ],
            "startsAt": _rfc3339(timezone.now()),
            "endsAt": _rfc3339(until),
            "createdBy": "lockstep",
            "comment": comment[:SHORT_MAX_CHARS],
        }
        try:
            answer = _request("POST", self.url(self.SILENCES), {**body, "id": silence_id} if silence_id else body)
        except TransportError as exc:
            # A refused id (Alertmanager answers 404 for one it no longer knows): a new silence then.
            # Never after an outage or a 5xx, where a new silence would double the one that exists.
            if not silence_id or exc.status is None or not 400 <= exc.status < 500:
                raise
            answer = _request("POST", self.url(self.SILENCES), body)
        try:
            return str(json.loads(answer)["silenceID"])
        except (ValueError, KeyError, TypeError) as exc:
            raise TransportError(f"Alertmanager answered no silenceID: {answer[:200]!r}") from exc

    def unsilence(self, silence_id: str) -> None:
        """Expire the silence; one Alertmanager no longer has is gone already."""
        try:
            _request("DELETE", self.url(f"/api/v2/silence/{quote(silence_id, safe='')}"), None)
        except TransportError as exc:
            if exc.status != 404:
                raise


class PagerDuty(Transport):
    """PagerDuty Events API v2 (`POST /v2/enqueue`), `dedup_key` "lockstep-incident-<id>": the same from
    the trigger through every update, retry, acknowledge and the resolve. Firing: trigger (a later
    revision updates the same PagerDuty incident); acknowledged in Lockstep: acknowledge; resolved:
    resolve."""

    kind = Webhook.Kind.PAGERDUTY.value
    EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
    SUMMARY_MAX_CHARS = 1024

    def notify(self, incident: Incident, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        url = self.webhook.url or self.EVENTS_URL
        key = dedup_key(incident)
        base = {"routing_key": self.webhook.secret, "dedup_key": key}
        if incident.state != Incident.State.FIRING:  # fixed, or the run ended: nothing left to page about
            _post_json(url, {**base, "event_action": "resolve"}, {})
            return {"dedup_key": key, "action": "resolve"}
        if incident.acked_by_id is None or (previous or {}).get("action") not in ("trigger", "acknowledge"):
            _post_json(url, self.trigger(incident, base), {})  # an acknowledge needs an incident to act on
        if incident.acked_by_id is None:
            return {"dedup_key": key, "action": "trigger"}
        _post_json(url, {**base, "event_action": "acknowledge"}, {})
        return {"dedup_key": key, "action": "acknowledge"}

    def trigger(self, incident: Incident, base: dict) -> dict:
        root = root_of(incident)
        event = {
            **base,
            "event_action": "trigger",
            "client": "Lockstep",
            "payload": {
                "summary": headline(incident)[: self.SUMMARY_MAX_CHARS],
                "severity": incident.severity if incident.severity in ("critical", "warning") else "error",
                "source": f"{incident.run.project.name}/{incident.run.key}"[:255],
                "class": root.kind[:255],
                "group": incident.run.key[:255],
                **({"component": root.frame[:255]} if root.frame else {}),
                "custom_details": bounded_json(incident),
            },
        }
        if url := _incident_url(incident):
            event["client_url"] = url
            event["links"] = [{"href": url, "text": f"Lockstep run {incident.run.key}"[:SHORT_MAX_CHARS]}]
        return event


class JsonWebhook(Transport):
    """The incident itself as JSON, for receivers of one's own: `Idempotency-Key` names the (incident,
    revision), so a receiver drops a retry it already took, and with a secret `X-Lockstep-Signature`
    is the HMAC-SHA256 of the exact body bytes."""

    kind = Webhook.Kind.JSON.value

    def notify(self, incident: Incident, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        raw = json.dumps(self.payload(incident)).encode()
        headers = {"Idempotency-Key": idempotency_key}
        if self.webhook.secret:
            headers["X-Lockstep-Signature"] = "sha256=" + signature(self.webhook.secret, raw)
        _post(self.webhook.url, raw, headers)
        return {}

    @staticmethod
    def payload(incident: Incident) -> dict:
        return {
            "project": incident.run.project.name,
            "revision": incident.revision,
            "url": _incident_url(incident) or None,
            "incident": bounded_json(incident),
        }


# --- what every sink says about an incident ----------------------------------------------


def members(incident: Incident) -> list[Alert]:
    """The incident's alerts, oldest first (fetched once per send)."""
    cached = getattr(incident, "_members", None)
    if cached is None:
        cached = incident._members = list(incident.alerts.select_related("run").order_by("first_seen", "id"))
    return cached


def root_of(incident: Incident) -> Alert:
    """The root alert; an incident whose root alert is gone is titled by its oldest alert."""
    if incident.root_id is not None:
        return incident.root
    alerts = members(incident)
    return alerts[0] if alerts else Alert(kind="incident", message=incident.cause, ranks=[], run=incident.run)


def consequences_of(incident: Incident) -> list[Alert]:
    root = root_of(incident)
    return [a for a in members(incident) if a.id != root.id]


def headline(incident: Incident) -> str:
    """ "rank_silent on rank 2 in run R (step 12): message" (bounded)."""
    root = root_of(incident)
    where = f" on rank{'s' if len(root.ranks) > 1 else ''} {ranks_text(root.ranks)}" if root.ranks else ""
    step = f" (step {root.step})" if root.step is not None else ""
    more = f" [+{len(consequences_of(incident))} consequences]" if consequences_of(incident) else ""
    return f"{root.kind}{where} in run {incident.run.key}{step}{more}: {root.message}"[:TEXT_MAX_CHARS]


def update_note(incident: Incident, previous: Receipt | None) -> str:
    """Where a destination holds no object per incident (a Slack channel), a later revision of a page
    it was already sent says it updates that page, so nobody reads a second cause into it; a cause
    that arrived after its symptom re-roots the incident, and the message says so."""
    page = (previous or {}).get("page")
    if not page:
        return ""
    rerooted = page.get("root") is not None and page.get("root") != incident.root_id
    return f"Update of incident #{incident.id}{', its cause found' if rerooted else ''}: "


def status_word(incident: Incident) -> str:
    if incident.state == Incident.State.RESOLVED:
        return "[RESOLVED]"
    if incident.state == Incident.State.ENDED_UNRESOLVED:
        return f"[{incident.severity.upper()}, RUN ENDED UNRESOLVED]"
    acked = f" ACKED by {incident.acked_by.get_username()}" if incident.acked_by_id else ""
    return f"[{incident.severity.upper()}{acked}]"


def folded(consequences: list[Alert]) -> str:
    """The consequences as a short list: one line each (kind, ranks, state), CONSEQUENCES_SHOWN at most."""
    lines = [
        f"• {a.kind} on {ranks_text(a.ranks)}{'' if a.state == Alert.State.FIRING else f' ({a.get_state_display()})'}: "
        f"{a.message[:120]}"
        for a in consequences[:CONSEQUENCES_SHOWN]
    ]
    if len(consequences) > CONSEQUENCES_SHOWN:
        lines.append(f"… and {len(consequences) - CONSEQUENCES_SHOWN} more")
    return "\n".join(lines)[:TEXT_MAX_CHARS]


def bounded_json(incident: Incident) -> dict:
    """`Incident.as_json` with messages cut to TEXT_MAX_CHARS and at most 50 consequences listed."""
    out = incident.as_json(members(incident))
    if out["root"]:
        out["root"]["message"] = out["root"]["message"][:TEXT_MAX_CHARS]
    out["consequences_total"] = len(out["consequences"])
    out["consequences"] = [{**c, "message": c["message"][:TEXT_MAX_CHARS]} for c in out["consequences"][:50]]
    return out


def ranks_text(ranks: list[int]) -> str:
    return rank_ranges(ranks, SHORT_MAX_CHARS) or "-"


def slack_escape(text: str, limit: int = TEXT_MAX_CHARS) -> str:
    """Slack's escaping of `&`, `<`, `>` (the only three it requires): `<!channel>`, `<@U123>` and
    `<https://x|label>` become plain text. Cut before escaping, so no entity is cut in half."""
    return text[:limit].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def signature(secret: str, raw: bytes) -> str:
    return hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()


def dedup_key(incident: Incident) -> str:
    """The PagerDuty incident of a Lockstep incident: the same from trigger to resolve."""
    return f"lockstep-incident-{incident.id}"


def rank_ranges(ranks: list[int], limit: int) -> str:
    """Sorted ranks as ranges ("1,3,5-9"), cut at `limit` characters with the number left out, so a
    1024-rank desync is a short, stable label."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    text = ",".join(parts)
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(",", 1)[0]
    shown = sum(int(p.split("-")[-1]) - int(p.split("-")[0]) + 1 for p in cut.split(","))
    return f"{cut},+{len(ordered) - shown}"


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _run_url(incident: Incident) -> str:
    """A link back to the run's page; empty when the public URL is not configured (no broken links)."""
    if not settings.LOCKSTEP_PUBLIC_URL:
        return ""
    return f"{settings.LOCKSTEP_PUBLIC_URL}/runs/{quote(incident.run.key, safe='')}/"


def _incident_url(incident: Incident) -> str:
    """The incident's root alert on its run's page (alerts carry `id="alert-N"`); empty without a public URL."""
    root_id = incident.root_id
    return f"{_run_url(incident)}#alert-{root_id}" if settings.LOCKSTEP_PUBLIC_URL and root_id else _run_url(incident)


def _post_json(url: str, body: Any, headers: dict[str, str]) -> bytes:
    return _post(url, json.dumps(body).encode(), headers)


def _post(url: str, raw: bytes, headers: dict[str, str]) -> bytes:
    return _request("POST", url, raw, headers)


def _request(method: str, url: str, body: Any, headers: dict[str, str] | None = None) -> bytes:
    """One guarded request (`outbound`); a refused URL, a network error, a timeout, a redirect or an
    error status is a `TransportError`."""
    raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    try:
        return outbound.request(method, url, raw, {"Content-Type": "application/json", **(headers or {})}).body
    except outbound.SendError as exc:
        raise TransportError(str(exc), exc.status) from exc
    except outbound.Refused as exc:
        raise TransportError(str(exc)) from exc


def for_webhook(webhook: Webhook) -> Transport:
    """The transport that speaks this destination's format."""
    return TRANSPORTS[webhook.kind](webhook)
