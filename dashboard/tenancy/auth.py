"""Bearer project tokens and session users: who is asking, and which projects they may see."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import HttpRequest

from dashboard.tenancy.models import Project, ProjectToken, Run


@dataclass(frozen=True)
class Principal:
    """A token (one project) or a logged-in user (their projects)."""

    project_ids: frozenset[int]
    user: object | None = None

    def runs(self):
        return Run.objects.filter(project_id__in=self.project_ids)

    def can_see(self, run: Run) -> bool:
        return run.project_id in self.project_ids


def bearer_token(request: HttpRequest) -> str | None:
    return token_of(request.headers.get("Authorization", ""))


def token_of(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value; None for any other."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def project_for_token(token: str) -> Project | None:
    found = ProjectToken.objects.select_related("project").filter(digest=ProjectToken.digest_of(token)).first()
    return found.project if found else None


def principal(request: HttpRequest) -> Principal | None:
    """Bearer token first (API clients), else the session user; None when neither is valid."""
    token = bearer_token(request)
    if token is not None:
        project = project_for_token(token)
        return Principal(frozenset({project.id})) if project else None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Principal(user_project_ids(user), user)
    return None


def user_project_ids(user) -> frozenset[int]:
    """The projects a user is a member of. Superusers too: membership is the one rule of pages, API,
    websockets and CLI; a superuser who must see a project adds themselves to it in the admin."""
    return frozenset(user.projects.values_list("id", flat=True))
