"""`manage.py addmember <project> <user>`: let a user see a project's runs (pages, API, CLI, live feeds).

Membership is the one rule of what a person sees (superusers too), so a team's own runs, sent with
their own token, stay invisible until someone adds them here (or in the admin).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TextIO

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dashboard.tenancy.models import Project

if TYPE_CHECKING:
    from django.contrib.auth.models import User


class Command(BaseCommand):
    help = "Make a user a member of a project, so they see its runs; --password-stdin creates a new user."
    stealth_options = ("stdin",)  # as createsuperuser: call_command(..., stdin=...) in tests

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("project", help="project name (as given to createtoken)")
        parser.add_argument("user", help="user name")
        parser.add_argument(
            "--password-stdin",
            action="store_true",
            help="create the user when missing, with the password read from the first line of stdin",
        )

    def handle(self, *args: object, project: str, user: str, password_stdin: bool, **options: Any) -> None:
        found = Project.objects.filter(name=project).first()
        if found is None:
            known = ", ".join(Project.objects.order_by("name").values_list("name", flat=True)[:20]) or "none yet"
            raise CommandError(f"no project {project!r} (projects: {known}; createtoken makes one)")
        member = self._user(user, password_stdin, options.get("stdin") or sys.stdin)
        found.members.add(member)
        names = ", ".join(found.members.order_by("username").values_list("username", flat=True))
        self.stdout.write(f"{member.get_username()} is a member of {found.name}; its members: {names}")

    def _user(self, name: str, password_stdin: bool, stdin: TextIO) -> User:
        users = get_user_model()
        existing = users.objects.filter(username=name).first()
        if existing is not None:
            return existing
        if not password_stdin:
            raise CommandError(f"no user {name!r}: add --password-stdin to create one, or use createsuperuser")
        password = stdin.readline().rstrip("\n")
        if not password:
            raise CommandError("--password-stdin read an empty password")
        self.stderr.write(f"created user {name}")
        return users.objects.create_user(name, password=password)
