"""Content types follow the models that changed app, so admin permissions and log entries keep pointing at them."""

from __future__ import annotations

from django.db import migrations


def move_content_types(old: str, moved: dict[str, str]) -> migrations.RunPython:
    """A reversible operation: the content types of `moved` (model name -> new app label) leave app `old`."""

    def forward(apps, schema_editor) -> None:
        _move(apps, [(old, new, model) for model, new in moved.items()])

    def backward(apps, schema_editor) -> None:
        _move(apps, [(new, old, model) for model, new in moved.items()])

    return migrations.RunPython(forward, backward)


def _move(apps, moves: list[tuple[str, str, str]]) -> None:
    content_type = apps.get_model("contenttypes", "ContentType")
    for source, target, model in moves:
        if not content_type.objects.filter(app_label=target, model=model).exists():
            content_type.objects.filter(app_label=source, model=model).update(app_label=target)
