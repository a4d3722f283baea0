"""Which runs a logged-in user may see: every page goes through here, so a run of another
project is a 404 (pages do not confirm that it exists)."""
from __future__ import annotations

from django.db.models import QuerySet
from django.http import Http404, HttpRequest

from dashboard.tenancy.auth import user_project_ids
from dashboard.tenancy.models import Run


def visible_runs(request: HttpRequest) -> QuerySet[Run]:
    return Run.objects.filter(project_id__in=user_project_ids(request.user))


def visible_run(request: HttpRequest, key: str) -> Run:
    found = visible_runs(request).select_related("project").filter(key=key).first()
    if found is None:
        raise Http404("no such run")
    return found
