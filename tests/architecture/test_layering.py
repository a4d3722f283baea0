"""The layering is enforced, not just described: imports point one way (.importlinter), and no app
names another app's table in SQL (it takes the name from the model's `_meta`, or better, asks the
owner: only the owning app writes its tables)."""
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
    result = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _tables_by_package() -> dict[str, set[str]]:
    """Python package of each app -> the tables its models own."""
    owned: dict[str, set[str]] = {}
    for config in apps.get_app_configs():
        if config.name.startswith(("dashboard", "ingest")):
            owned.setdefault(config.name, set()).update(m._meta.db_table for m in config.get_models())
    return owned


def _strings(path: Path) -> list[tuple[int, str]]:
    """String constants of a module (f-string parts included), docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def _package_of(path: Path, packages: list[str]) -> str | None:
    dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    matches = [p for p in packages if dotted == p or dotted.startswith(p + ".")]
    return max(matches, key=len) if matches else None


def test_no_app_names_another_apps_table_in_sql():
    owned = _tables_by_package()
    packages = list(owned)
    offences = []
    for path in sorted([*ROOT.glob("dashboard/**/*.py"), *ROOT.glob("ingest/**/*.py")]):
        package = _package_of(path, packages)
        if package is None or "migrations" in path.parts:
            continue
        foreign = set().union(*(tables for p, tables in owned.items() if p != package))
        pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, foreign))) + r")\b")
        for line, text in _strings(path):
            for table in pattern.findall(text):
                offences.append(f"{path.relative_to(ROOT)}:{line} names {table}")
    assert not offences, "\n".join(offences)


def test_the_checks_see_a_violation(tmp_path):
    """The table check is not vacuous: it finds a foreign table in a string of a module."""
    probe = ROOT / "ingest" / "_layering_probe.py"
    probe.write_text('SQL = "UPDATE dashboard_alert SET state = %s"\n')
    try:
        owned = _tables_by_package()
        assert _package_of(probe, list(owned)) == "ingest"
        assert any("dashboard_alert" in text for _, text in _strings(probe))
        assert "dashboard_alert" in owned["dashboard.detection"]
    finally:
        probe.unlink()
