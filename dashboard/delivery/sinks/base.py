"""What every sink is: its kind, its configuration schema (a URL and a secret, each needed, optional
or refused), its rendering and sending of an incident revision (`notify`), and its delivery policy.
Subclasses register themselves in `SINKS` by `kind`."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from dashboard.delivery.transports import Receipt, TransportError

if TYPE_CHECKING:
    from dashboard.delivery.models import Webhook
    from dashboard.detection.models import Incident

__all__ = ["SINKS", "Receipt", "Sink", "TransportError"]

SINKS: dict[str, type[Sink]] = {}  # kind -> class, filled by Sink.__init_subclass__
Need = Literal["required", "optional", "refused"]


class Sink:
    """Sends an incident revision to one destination. `notify` raises `TransportError`, returns its receipt.

    Schema: `needs_url` and `needs_secret` say whether the destination needs, may have or must not have each;
    `default_url` is used when the URL is left blank; `url_is_credential` keeps the URL out of exports.
    Policy: a `stateful` sink holds an open object per incident (so it still hears of a silenced
    incident's ack or growth, and is resolved); `refresh` re-sends a firing incident that often."""

    kind: ClassVar[str]
    label: ClassVar[str]
    needs_url: ClassVar[Need] = "required"
    needs_secret: ClassVar[Need] = "refused"
    secret_missing: ClassVar[str] = ""
    default_url: ClassVar[str] = ""
    url_is_credential: ClassVar[bool] = False
    stateful: ClassVar[bool] = False
    refresh: ClassVar[timedelta | None] = None

    def __init__(self, webhook: Webhook) -> None:
        self.webhook = webhook

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register by `kind`, so that a new sink is one class and cannot silently shadow another."""
        super().__init_subclass__(**kwargs)
        if cls.kind in SINKS:
            raise TypeError(f"sink kind {cls.kind!r} is taken by {SINKS[cls.kind].__name__}")
        SINKS[cls.kind] = cls

    @classmethod
    def problem(cls, url: str, secret: str) -> dict[str, str]:
        """What the configuration lacks or must not have, as {field: message}; empty when it is fine."""
        if cls.needs_url == "required" and not url:
            return {"url": f"a {cls.label} needs a URL"}
        if cls.needs_secret == "required" and not secret:
            return {"secret": cls.secret_missing or f"a {cls.label} needs a secret"}
        if cls.needs_secret == "refused" and secret:
            return {"secret": f"a {cls.label} takes no secret"}
        return {}

    def notify(self, incident: Incident, idempotency_key: str, previous: Receipt | None = None) -> Receipt:
        """Send the incident as it is now; `idempotency_key` names the revision, the same on every retry."""
        raise NotImplementedError
