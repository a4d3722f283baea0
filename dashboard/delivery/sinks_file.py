"""Alert destinations as code: a TOML file, kept in a team's config repository, applied idempotently
(`manage.py sinks apply FILE`), and the current ones printed in the same form (`sinks export`).

    [[destination]]
    project = "vision"
    kind = "pagerduty"                       # a sink kind: alertmanager | json | pagerduty | slack
    secret = "${PAGERDUTY_ROUTING_KEY}"      # ${NAME}: from the environment, refused when unset
    # url = "..."  active = true

A destination is identified by (project, kind, url): applying sets its `secret` and `active` to what
the file says, creates what is missing and, with `prune`, removes the destinations of the file's
projects that it does not list. Every destination is checked as the admin form checks it
(`Webhook.full_clean`) before anything is stored, and all of it is one transaction.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import transaction

from dashboard.delivery import sinks
from dashboard.delivery.models import Webhook
from dashboard.tenancy.models import Project

FIELDS = {"project", "kind", "url", "secret", "active"}
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
CREATED, UPDATED, UNCHANGED, REMOVED = "created", "updated", "unchanged", "removed"


class SinksFileError(Exception):
    """The file cannot be applied as it is: one line saying where and why; nothing was stored."""


@dataclass(frozen=True)
class Entry:
    project: str
    kind: str
    url: str
    secret: str
    active: bool

    @property
    def identity(self) -> tuple[str, str, str]:
        return self.project, self.kind, self.url


@dataclass(frozen=True)
class Change:
    action: str  # created | updated | unchanged | removed
    project: str
    kind: str
    url: str

    def line(self) -> str:
        return f"{self.action:<9} {self.project}  {self.kind}  {shown(self.url)}"


def shown(url: str) -> str:
    """A destination's URL without what may be a credential (a Slack webhook's path is its key)."""
    if not url:
        return "(default URL)"
    parts = urlsplit(url)
    return (
        f"{parts.scheme}://{parts.hostname or ''}{':' + str(parts.port) if parts.port else ''}/…"
        if parts.path.strip("/")
        else f"{parts.scheme}://{parts.netloc}"
    )


def parse(text: str, env: Mapping[str, str]) -> list[Entry]:
    """The file's destinations, `${NAME}` taken from `env`; a SinksFileError for anything amiss."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SinksFileError(f"not valid TOML: {exc}") from None
    unknown = set(data) - {"destination"}
    if unknown:
        raise SinksFileError(f"unknown top-level key(s) {sorted(unknown)}: destinations go in [[destination]] tables")
    rows = data.get("destination", [])
    if not isinstance(rows, list):
        raise SinksFileError("`destination` must be an array of tables ([[destination]])")
    entries = [_entry(i, row, env) for i, row in enumerate(rows, 1)]
    seen: dict[tuple[str, str, str], int] = {}
    for i, entry in enumerate(entries, 1):
        if entry.identity in seen:
            raise SinksFileError(
                f"destination {i} repeats destination {seen[entry.identity]} "
                f"({entry.project}, {entry.kind}, {shown(entry.url)})"
            )
        seen[entry.identity] = i
    return entries


def _entry(i: int, row: object, env: Mapping[str, str]) -> Entry:
    where = f"destination {i}"
    if not isinstance(row, dict):
        raise SinksFileError(f"{where}: must be a table")
    unknown = set(row) - FIELDS
    if unknown:
        raise SinksFileError(f"{where}: unknown key(s) {sorted(unknown)} (known: {sorted(FIELDS)})")
    for key in ("project", "kind"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise SinksFileError(f"{where}: `{key}` is required (a string)")
    if row["kind"] not in sinks.SINKS:
        raise SinksFileError(f"{where}: kind {row['kind']!r} is not one of {sinks.kinds()}")
    if not isinstance(row.get("active", True), bool):
        raise SinksFileError(f"{where}: `active` is true or false")
    text = {
        key: _expand(f"{where} ({row['project']}, {row['kind']}) {key}", row.get(key, ""), env)
        for key in ("project", "kind", "url", "secret")
    }
    return Entry(text["project"], text["kind"], text["url"], text["secret"], row.get("active", True))


def _expand(where: str, value: object, env: Mapping[str, str]) -> str:
    if not isinstance(value, str):
        raise SinksFileError(f"{where}: must be a string")

    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env or env[name] == "":
            raise SinksFileError(f"{where}: environment variable {name} is not set")
        return env[name]

    return VARIABLE.sub(variable, value)


def apply(entries: list[Entry], prune: bool = False, dry_run: bool = False) -> list[Change]:
    """Make the database say what the entries say (for their projects); the changes, in file order,
    removals last. All or nothing: a destination that fails `full_clean` stores none."""
    projects = _projects({e.project for e in entries})
    changes: list[Change] = []
    kept: set[int] = set()
    with transaction.atomic():
        for i, entry in enumerate(entries, 1):
            found = (
                Webhook.objects.select_for_update()
                .filter(project=projects[entry.project], kind=entry.kind, url=entry.url)
                .order_by("id")
                .first()
            )
            hook = found or Webhook(project=projects[entry.project], kind=entry.kind, url=entry.url)
            same = found is not None and (found.secret, found.active) == (entry.secret, entry.active)
            hook.secret, hook.active = entry.secret, entry.active
            if not same:
                _check(i, entry, hook)
                hook.save()
            kept.add(hook.id)
            changes.append(Change(CREATED if found is None else UNCHANGED if same else UPDATED, *entry.identity))
        if prune:
            stale = Webhook.objects.filter(project__in=projects.values()).exclude(id__in=kept).select_related("project")
            for hook in stale.order_by("project__name", "kind", "id"):
                changes.append(Change(REMOVED, hook.project.name, hook.kind, hook.url))
                hook.delete()
        if dry_run:
            transaction.set_rollback(True)
    return changes


def _projects(names: set[str]) -> dict[str, Project]:
    found = {p.name: p for p in Project.objects.filter(name__in=names)}
    missing = sorted(names - set(found))
    if missing:
        raise SinksFileError(f"no such project(s): {', '.join(missing)} (projects are made in the admin, not here)")
    return found


def _check(i: int, entry: Entry, hook: Webhook) -> None:
    try:
        hook.full_clean()
    except ValidationError as exc:
        said = "; ".join(f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items())
        raise SinksFileError(f"destination {i} ({entry.project}, {entry.kind}): {said}") from None


def export(project_names: list[str] | None = None) -> str:
    """The destinations (of these projects, or all) as a file `apply` takes, secrets never shown: each
    secret is a `${SINK_SECRET_<id>}`, each Slack URL (its path is its key) a `${SINK_URL_<id>}`, to
    set in the environment before applying it."""
    hooks = Webhook.objects.select_related("project").order_by("project__name", "kind", "id")
    if project_names:
        hooks = hooks.filter(project__name__in=project_names)
    lines = [
        "# Lockstep alert destinations (`python manage.py sinks apply FILE`); secrets are not shown:"
        " set each ${SINK_SECRET_<id>} / ${SINK_URL_<id>} in the environment, or put your own variable there."
    ]
    for hook in hooks:
        lines += ["", "[[destination]]", f"project = {_quoted(hook.project.name)}", f"kind = {_quoted(hook.kind)}"]
        if sinks.SINKS[hook.kind].url_is_credential:  # a Slack webhook URL is its own key
            lines.append(f'url = "${{SINK_URL_{hook.id}}}"')
        elif hook.url:
            lines.append(f"url = {_quoted(hook.url)}")
        if hook.secret:
            lines.append(f'secret = "${{SINK_SECRET_{hook.id}}}"')
        if not hook.active:
            lines.append("active = false")
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    """A TOML basic string."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'
