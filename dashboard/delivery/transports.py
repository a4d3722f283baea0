"""What every sink says about an incident, and how it says it over HTTP (the sinks themselves are
dashboard/delivery/sinks/, one module per kind).

Only incidents page: one incident is one Slack message per revision, one Alertmanager alert, one
PagerDuty incident, one JSON document per revision, titled by its root (the alert where the trouble
started), its consequences folded into a short list. Text the agents supplied (messages, frames, run
keys) is bounded for every sink and, for Slack, escaped so that `<!channel>` or `<https://evil|link>`
arrives as inert text.

A sink's `notify` gets the receipt the previous sent revision to the same destination returned
(empty the first time) and returns this one's: Alertmanager needs it to end a label set it was given
before when the labels change (another root, a higher severity), PagerDuty to trigger before an
acknowledge it has no incident for.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.urls import reverse

from dashboard.delivery import outbound
from dashboard.detection.models import Alert, Incident, remedy_of

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


# --- what every sink says about an incident ----------------------------------------------


def members(incident: Incident) -> list[Alert]:
    """The incident's alerts, oldest first (fetched once per send)."""
    cached = getattr(incident, "_members", None)
    if cached is None:
        cached = incident._members = list(incident.alerts.select_related("run").order_by("first_seen", "id"))
    return cached


def root_of(incident: Incident) -> Alert:
    """The root alert; an incident whose root alert is gone is titled by its oldest alert."""
    if incident.root is not None:  # no query when root_id is None
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


def remedy_line(incident: Incident) -> str:
    """What to do about it, as the run page says it, and where the alert reference says more: its
    kind's section on this server ("... (https://lockstep.example/alerts/reference/#kind)"), or
    "(docs/alerts.md#kind)" without a public URL (bounded)."""
    remedy = remedy_of(root_of(incident))
    return f"{remedy['text']} ({reference_url(root_of(incident).kind) or remedy['doc']})"[:TEXT_MAX_CHARS]


def reference_url(kind: str) -> str:
    """The alert reference's section of `kind` on this server (docs/alerts.md, rendered); empty when
    the public URL is not configured (no broken links)."""
    if not settings.LOCKSTEP_PUBLIC_URL:
        return ""
    return f"{settings.LOCKSTEP_PUBLIC_URL}{reverse('alert-reference')}#{quote(kind, safe='')}"


def update_note(incident: Incident, previous: Receipt | None) -> str:
    """Where a destination holds no object per incident (a Slack channel), a later revision of a page
    it was already sent says what it changes, so nobody reads a second cause into it: who acknowledged
    it (or that nobody does any more), or that it updates the page; a cause that arrived after its
    symptom re-roots the incident, and the message says so."""
    page = (previous or {}).get("page")
    if not page:
        return ""
    acker = incident.acked_by
    if acker is not None and not page.get("acked"):
        return f"{acker.get_username()} acknowledged incident #{incident.id}: "
    if page.get("acked") and acker is None and incident.state == Incident.State.FIRING:
        return f"Incident #{incident.id} is no longer acknowledged: "
    rerooted = page.get("root") is not None and page.get("root") != incident.root_id
    return f"Update of incident #{incident.id}{', its cause found' if rerooted else ''}: "


def status_word(incident: Incident) -> str:
    if incident.state == Incident.State.RESOLVED:
        return "[RESOLVED]"
    if incident.state == Incident.State.ENDED_UNRESOLVED:
        return f"[{incident.severity.upper()}, RUN ENDED UNRESOLVED]"
    acked = f" ACKED by {incident.acked_by.get_username()}" if incident.acked_by is not None else ""
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


def bounded_json(incident: Incident) -> dict[str, Any]:
    """`Incident.as_json` with messages cut to TEXT_MAX_CHARS and at most 50 consequences listed."""
    out = incident.as_json(members(incident))
    if out["root"]:
        out["root"]["message"] = out["root"]["message"][:TEXT_MAX_CHARS]
    if out.get("remedy") and (url := reference_url(root_of(incident).kind)):
        out["remedy"] = {**out["remedy"], "url": url}
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


def rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def run_url(incident: Incident) -> str:
    """A link back to the run's page; empty when the public URL is not configured (no broken links)."""
    if not settings.LOCKSTEP_PUBLIC_URL:
        return ""
    return f"{settings.LOCKSTEP_PUBLIC_URL}/runs/{quote(incident.run.key, safe='')}/"


def incident_url(incident: Incident) -> str:
    """The incident's root alert on its run's page (alerts carry `id="alert-N"`); empty without a public URL."""
    root_id = incident.root_id
    return f"{run_url(incident)}#alert-{root_id}" if settings.LOCKSTEP_PUBLIC_URL and root_id else run_url(incident)


def post_json(url: str, body: Any, headers: dict[str, str]) -> bytes:
    return post(url, json.dumps(body).encode(), headers)


def post(url: str, raw: bytes, headers: dict[str, str]) -> bytes:
    return request("POST", url, raw, headers)


def request(method: str, url: str, body: Any, headers: dict[str, str] | None = None) -> bytes:
    """One guarded request (`outbound`); a refused URL, a network error, a timeout, a redirect or an
    error status is a `TransportError`."""
    raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    try:
        return outbound.request(method, url, raw, {"Content-Type": "application/json", **(headers or {})}).body
    except outbound.SendError as exc:
        raise TransportError(str(exc), exc.status) from exc
    except outbound.Refused as exc:
        raise TransportError(str(exc)) from exc
