"""Every environment variable the product reads is listed in docs/operating.md (server, agent and the
launcher's variables alike): a variable added to the code without a line there fails here."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("agents", "dashboard", "ingest", "lockstep_cli")
NAME = re.compile(r"[A-Z][A-Z0-9_]+")
# helpers that take a variable's name first: os.environ.get / os.getenv / setdefault, and the
# settings' and agent config's own readers
READERS = {"get", "getenv", "setdefault", "_env_bool", "_num"}


def _sources() -> Iterator[Path]:
    yield ROOT / "manage.py"
    for package in PRODUCT:
        yield from (p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


def _reads(tree: ast.AST) -> Iterator[str]:
    """Names read from the environment: `environ[...]`, and the first argument of a reader called on
    the environment (os.environ, os, an `env` mapping) or by name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and NAME.fullmatch(key.value):
                yield key.value
        if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        name, func = node.args[0].value, node.func
        if not (isinstance(name, str) and NAME.fullmatch(name)):
            continue
        if isinstance(func, ast.Name) and func.id in READERS:
            yield name
        elif isinstance(func, ast.Attribute) and func.attr in READERS:
            owner = ast.unparse(func.value)
            if "environ" in owner or owner in {"os", "env"}:
                yield name


def read_variables() -> set[str]:
    return {name for path in _sources() for name in _reads(ast.parse(path.read_text(), str(path)))}


def test_every_variable_the_code_reads_is_in_the_operating_guide():
    found = read_variables()
    assert {"DATABASE_URL", "LOCKSTEP_SPOOL_DIR", "LOCKSTEP_RUN_NAME", "PORT", "RANK"} <= found  # the scan works
    listed = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", (ROOT / "docs" / "operating.md").read_text()))
    assert sorted(found - listed) == []
