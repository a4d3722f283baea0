"""Bearer project tokens and session users: who is asking, and which projects they may see."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import QuerySet
from django.http import HttpRequest

from dashboard.tenancy.models import ProjectToken, Run

if TYPE_CHECKING:
    from django.contrib.auth.models import User


@dataclass(frozen=True)
class Principal:
    """A token (one project) or a logged-in user (their projects)."""

    project_ids: frozenset[int]
    user: User | None = None
    scopes: frozenset[str] = frozenset()  # a token's (`ProjectToken.scopes`); a user's rights are their membership

    def runs(self) -> QuerySet[Run]:
        return Run.objects.filter(project_id__in=self.project_ids)

    def can_see(self, run: Run) -> bool:
        return run.project_id in self.project_ids

    def may(self, scope: str) -> bool:
        """Whether the caller may do what `scope` names: a member may do all of it in their projects."""
        return self.user is not None or scope in self.scopes


def bearer_token(request: HttpRequest) -> str | None:
    return token_of(request.headers.get("Authorization", ""))


def token_of(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value; None for any other."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_for(token: str) -> ProjectToken | None:
    """The stored token (with its project) of a bearer token; None when unknown."""
    return ProjectToken.objects.select_related("project").filter(digest=ProjectToken.digest_of(token)).first()


def principal(request: HttpRequest) -> Principal | None:
    """Bearer token first (API clients), else the session user; None when neither is valid."""
    token = bearer_token(request)
    if token is not None:
        found = token_for(token)
        return Principal(frozenset({found.project_id}), scopes=frozenset(found.scopes)) if found else None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return Principal(user_project_ids(user), user)
    return None


def user_project_ids(user: User) -> frozenset[int]:
    """The projects a user is a member of. Superusers too: membership is the one rule of pages, API,
    websockets and CLI; a superuser who must see a project adds themselves to it in the admin."""
    return frozenset(user.projects.values_list("id", flat=True))
