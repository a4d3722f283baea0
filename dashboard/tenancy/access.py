"""Which runs a caller may see: the runs of their projects, nothing else.

The read API (token or session) and the pages (session) both resolve runs through here, so one
rule decides what either door shows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboard.tenancy.auth import Principal, user_project_ids
from dashboard.tenancy.models import Run

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def principal_for(user: User) -> Principal:
    """A logged-in page user as the same kind of caller the API sees (never a bearer token)."""
    return Principal(user_project_ids(user), user)


def visible_run(caller: Principal, key: str, project_id: int | None = None) -> Run | None:
    """The caller's run of that key (within `project_id` when given); None when it is missing or
    belongs to another project: callers answer both the same, so nobody can probe for keys.
    Keys are unique per project; a user in two projects that both have the key gets the newest.
    A key with a NUL byte is nobody's: PostgreSQL's text cannot hold one, and the query would fail
    (a websocket's run key reaches here with no middleware in front, `dashboard.web.input_bounds`)."""
    if "\x00" in key:
        return None
    runs = caller.runs().select_related("project").filter(key=key)
    if project_id is not None:
        runs = runs.filter(project_id=project_id)
    return runs.first()
