"""The layering is enforced, not just described: imports point one way (.importlinter), no app
names another app's table in SQL (it takes the name from the model's `_meta`, or better, asks the
owner), and no app writes another app's models through the ORM: only the owning app writes its tables."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _tables_by_package() -> dict[str, set[str]]:
    """Python package of each app -> the tables its models own."""
    owned: dict[str, set[str]] = {}
    for config in apps.get_app_configs():
        if config.name.startswith(("dashboard", "ingest")):
            owned.setdefault(config.name, set()).update(m._meta.db_table for m in config.get_models())
    return owned


def _app_modules(root: Path, packages: list[str]) -> list[tuple[Path, str]]:
    """(module, its app's package) of every app module under `root`, migrations left out."""
    found = []
    for path in sorted([*root.glob("dashboard/**/*.py"), *root.glob("ingest/**/*.py")]):
        package = _package_of(path, packages, root)
        if package is not None and "migrations" not in path.parts:
            found.append((path, package))
    return found


def _strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module (f-string parts included), docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def _package_of(path: Path, packages: list[str], root: Path = ROOT) -> str | None:
    dotted = ".".join(path.relative_to(root).with_suffix("").parts)
    matches = [p for p in packages if dotted == p or dotted.startswith(p + ".")]
    return max(matches, key=len) if matches else None


def _foreign_tables_named(root: Path, owned: dict[str, set[str]]) -> list[str]:
    """Every string in the apps' modules under `root` that names a table another package owns."""
    offences = []
    for path, package in _app_modules(root, list(owned)):
        foreign = set().union(*(tables for p, tables in owned.items() if p != package))
        pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, foreign))) + r")\b")
        for line, text in _strings(path):
            for table in pattern.findall(text):
                offences.append(f"{path.relative_to(root)}:{line} names {table}")
    return offences


def test_every_table_is_named_for_the_app_that_owns_it():
    """`tenancy_run`, `ledger_gradslot`, `detection_alert`: a reader of SQL or of the database knows the owner."""
    for config in apps.get_app_configs():
        if config.name.startswith(("dashboard", "ingest")):
            misnamed = [
                m._meta.db_table for m in config.get_models() if not m._meta.db_table.startswith(config.label + "_")
            ]
            assert not misnamed, f"{config.label} owns tables named for another app: {misnamed}"


def test_no_app_names_another_apps_table_in_sql():
    offences = _foreign_tables_named(ROOT, _tables_by_package())
    assert not offences, "\n".join(offences)


def test_the_checks_see_a_violation(tmp_path):
    """The table check is not vacuous: it finds a foreign table in a string of a module (a copy of
    the layout in a temporary folder, never a file in the source tree)."""
    probe = tmp_path / "ingest" / "_layering_probe.py"
    probe.parent.mkdir()
    probe.write_text('SQL = "UPDATE detection_alert SET state = %s"\n')
    owned = _tables_by_package()
    assert "detection_alert" in owned["dashboard.detection"]
    assert _foreign_tables_named(tmp_path, owned) == ["ingest/_layering_probe.py:1 names detection_alert"]


WRITES = {"create", "bulk_create", "bulk_update", "update", "get_or_create", "update_or_create", "delete", "save"}


def _models_by_package() -> dict[str, set[str]]:
    """Python package of each app -> the class names of its models."""
    owned: dict[str, set[str]] = {}
    for config in apps.get_app_configs():
        if config.name.startswith(("dashboard", "ingest")):
            owned.setdefault(config.name, set()).update(m.__name__ for m in config.get_models())
    return owned


def _written_model(call: ast.Call) -> tuple[str, str] | None:
    """(model class name, method) of a write whose chain starts at a model class: `Run.objects.create(...)`,
    `Run.objects.filter(...).update(...)`, `Run(...).save()`. Writes through an instance held in a
    variable are not seen (no types here); the owner's functions are the way such writes go."""
    if not isinstance(call.func, ast.Attribute) or call.func.attr not in WRITES:
        return None
    node: ast.expr = call.func.value
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr == "objects":
            return node.value.id, call.func.attr
        elif isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Name) and call.func.attr == "save":
            return node.id, "save"
        else:
            return None


def _foreign_models_written(root: Path, owned: dict[str, set[str]]) -> list[str]:
    """Every ORM write in the apps' modules under `root` to a model another package owns."""
    offences = []
    for path, package in _app_modules(root, list(owned)):
        foreign = set().union(*(models for p, models in owned.items() if p != package)) - owned.get(package, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and (written := _written_model(node)) and written[0] in foreign:
                owner = next(p for p, models in owned.items() if written[0] in models)
                offences.append(
                    f"{path.relative_to(root)}:{node.lineno} writes {written[0]} ({written[1]}), owned by {owner}"
                )
    return offences


def test_no_app_writes_another_apps_models_through_the_orm():
    offences = _foreign_models_written(ROOT, _models_by_package())
    assert not offences, "\n".join(offences)


def test_the_orm_check_sees_a_violation(tmp_path):
    """The ORM check is not vacuous: writes to another app's model, through its manager, a queryset
    chain or a new instance, are each found; reads and the app's own models are not."""
    probe = tmp_path / "ingest" / "_layering_probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "from dashboard.detection.models import Alert\n"
        "Alert.objects.create(kind='x')\n"
        "Alert.objects.filter(kind='x').exclude(state='resolved').update(state='resolved')\n"
        "Alert(kind='x').save()\n"
        "Alert.objects.filter(kind='x').count()\n"
    )
    owned = _models_by_package()
    assert "Alert" in owned["dashboard.detection"]
    assert _foreign_models_written(tmp_path, owned) == [
        "ingest/_layering_probe.py:2 writes Alert (create), owned by dashboard.detection",
        "ingest/_layering_probe.py:3 writes Alert (update), owned by dashboard.detection",
        "ingest/_layering_probe.py:4 writes Alert (save), owned by dashboard.detection",
    ]
