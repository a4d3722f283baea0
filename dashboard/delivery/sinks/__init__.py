"""The kinds of alert destination, one module per kind (healthchecks' transports): each defines one
`Sink` subclass that carries its name, what it needs configured, how it renders an incident and how
it is delivered. Every module of this package is imported here, and each class registers itself by
its `kind`, so the model's choices, the admin, the TOML loader and delivery all read `SINKS` and a
new sink is one file (docs/integrations.md, "Adding a sink")."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from dashboard.delivery.sinks.base import SINKS, Receipt, Sink, TransportError

if TYPE_CHECKING:  # the model imports this package
    from dashboard.delivery.models import Webhook

__all__ = ["SINKS", "Receipt", "Sink", "TransportError", "choices", "for_webhook", "kinds"]

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")


def choices() -> list[tuple[str, str]]:
    """(kind, label) of every sink, for the model field and the admin form."""
    return [(kind, sink.label) for kind, sink in SINKS.items()]


def kinds(stateful: bool | None = None) -> list[str]:
    """The registered kinds; with `stateful`, only those that do (or do not) hold an object per incident."""
    return [kind for kind, sink in SINKS.items() if stateful is None or sink.stateful == stateful]


def for_webhook(webhook: Webhook) -> Sink:
    """The sink that speaks this destination's format."""
    return SINKS[webhook.kind](webhook)
