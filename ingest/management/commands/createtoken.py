"""`manage.py createtoken <project> [--scope S ...]`: new project token on the last line of stdout."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.validators import validate_slug

from dashboard.tenancy.models import DEFAULT_SCOPES, TOKEN_SCOPES, Project, ProjectToken


class Command(BaseCommand):
    help = (
        "Create a project (if needed) and print a new token for it as the last line: by default it may "
        f"{' and '.join(DEFAULT_SCOPES)}; --scope names each scope it gets instead."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("project", help="project name (a slug: letters, digits, - and _)")
        parser.add_argument(
            "--scope",
            action="append",
            help=f"what the token may do, repeated or comma-separated: {', '.join(TOKEN_SCOPES)} "
            f"(default {','.join(DEFAULT_SCOPES)}; resolve and baseline can clear `lockstep check`)",
        )

    def handle(self, *args: object, project: str, scope: list[str] | None, **options: object) -> None:
        try:
            validate_slug(project)
        except ValidationError:
            raise CommandError(f"project name {project!r} must use only letters, digits, '-' and '_'") from None
        scopes = tuple(s.strip() for given in scope for s in given.split(",") if s.strip()) if scope else DEFAULT_SCOPES
        unknown = sorted(set(scopes) - set(TOKEN_SCOPES))
        if unknown or not scopes:
            raise CommandError(f"unknown scope {', '.join(unknown) or '(none)'}: use {', '.join(TOKEN_SCOPES)}")
        found, created = Project.named(project)
        if created:
            self.stderr.write(f"created project {found.name}")
        self.stderr.write(f"token scopes: {', '.join(s for s in TOKEN_SCOPES if s in scopes)}")
        self.stderr.write(_who_sees(found))
        self.stdout.write(ProjectToken.issue(found, scopes))


def _who_sees(project: Project) -> str:
    """Runs sent with this token show on the dashboard to the project's members only: say who they are."""
    names = list(project.members.order_by("username").values_list("username", flat=True))
    if names:
        return f"its runs are visible to: {', '.join(names)} (more: manage.py addmember {project.name} USER)"
    return f"no user sees its runs yet: manage.py addmember {project.name} USER"
