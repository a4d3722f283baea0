"""`manage.py createtoken <project>`: new project token on the last line of stdout."""

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_slug

from dashboard.tenancy.models import Project, ProjectToken


class Command(BaseCommand):
    help = "Create a project (if needed) and print a new ingest/read token for it as the last line."

    def add_arguments(self, parser) -> None:
        parser.add_argument("project", help="project name (a slug: letters, digits, - and _)")

    def handle(self, *args, project: str, **options) -> None:
        try:
            validate_slug(project)
        except ValidationError:
            raise CommandError(f"project name {project!r} must use only letters, digits, '-' and '_'") from None
        found, created = Project.named(project)
        if created:
            self.stderr.write(f"created project {found.name}")
        self.stdout.write(ProjectToken.issue(found))
