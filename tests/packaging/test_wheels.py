"""Both wheels as a user gets them: built by scripts/build-wheels.sh, the agent's installed offline
into a clean venv that has only torch (this environment's, linked in), then a real 2-rank torchrun
gloo job under it from a folder outside the tree (so every import comes from the wheel), and the
server's unpacked next to the test environment's packages."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from agents.launch import torchrun
from tests.agents import two_rank_job
from tests.stack import ROOT, free_port

pytestmark = pytest.mark.e2e  # real torchrun jobs, like tests/e2e/


def _run(args: list, timeout: float = 300, **kw) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, f"{args}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def _clean_env(**extra: str) -> dict:
    """The environment less anything that would put the tree or the test venv on the path."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    return {**env, **extra}


def _torch_closure() -> list:
    """torch's distribution and those it requires (markers for this interpreter), as installed here."""
    found, todo = {}, ["torch"]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in found:
            continue
        found[name] = dist = metadata.distribution(name)
        todo += [
            r.name
            for r in map(Requirement, dist.requires or [])
            if r.marker is None or r.marker.evaluate({"extra": ""})
        ]
    return list(found.values())


def _link_torch(venv: Path) -> None:
    """Put this environment's torch and its requirements into the venv, as `pip install torch` from this
    machine's wheels would (the same files, linked, not unpacked again): every top-level entry of each
    distribution's RECORD. One the venv already has (its bundled setuptools) is replaced, as pip upgrades it.
    The agent asks for none of them, so the offline install below never uninstalls through a link."""
    [site] = (venv / "lib").glob("python*/site-packages")
    own = {d.metadata["Name"].lower(): d for d in metadata.distributions(path=[str(site)])}
    for dist in _torch_closure():
        if (old := own.get(dist.metadata["Name"].lower())) is not None:
            for top in _tops(old):
                path = site / top
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        for top in _tops(dist):
            source = Path(dist.locate_file(top))
            assert source.exists(), source
            (site / top).symlink_to(source)


def _tops(dist) -> set[str]:
    return {Path(f).parts[0] for f in dist.files if not str(f).startswith("..")} - {"__pycache__"}


@pytest.fixture(scope="module")
def torch_venv(tmp_path_factory):
    """A clean venv made in the background while the wheels build; `agent_venv` waits for it and
    then gives it torch (`_link_torch`)."""
    venv = tmp_path_factory.mktemp("agent-venv")
    base = getattr(sys, "_base_executable", sys.executable)
    proc = subprocess.Popen(
        [base, "-m", "venv", venv],
        env=_clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        yield venv, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


@pytest.fixture(scope="module")
def dist(torch_venv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    _run(["bash", ROOT / "scripts" / "build-wheels.sh", out], env={**os.environ, "PYTHON": sys.executable})
    return out


def _wheel(dist: Path, name: str) -> Path:
    [found] = dist.glob(f"{name}-*.whl")
    return found


def _metadata(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        [meta] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return z.read(meta).decode().splitlines()


@pytest.fixture(scope="module")
def agent_venv(torch_venv, dist) -> Path:
    """The venv with torch, then the agent from dist/ alone, offline, as docs/packaging.md says."""
    venv, proc = torch_venv
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    _link_torch(venv)
    _run(
        [
            venv / "bin" / "python",
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            dist,
            "lockstep-agent[cli]",
        ],
        env=_clean_env(),
    )
    return venv


def _pin(requirement: str) -> str:
    [line] = [
        line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith(requirement + "==")
    ]
    return line


def test_agent_wheel_needs_msgspec_only_and_never_pulls_torch(dist):
    requires = [
        line.split(":", 1)[1].strip()
        for line in _metadata(_wheel(dist, "lockstep_agent"))
        if line.startswith("Requires-Dist:")
    ]
    assert requires == [_pin("msgspec"), f"{_pin('websockets')}; extra == 'cli'"]
    with zipfile.ZipFile(_wheel(dist, "lockstep_agent")) as z:
        names = set(z.namelist())
    assert {"agents/fingerprint_native.c", "agents/__main__.py", "agents/protocol.py", "lockstep_cli/main.py"} <= names
    assert not [n for n in names if n.startswith(("dashboard/", "ingest/", "demo/", "tests/")) or "__pycache__" in n]


def test_agent_from_the_wheel_runs_a_two_rank_job_offline(agent_venv, tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "ddp_job.py").write_text((ROOT / "demo" / "ddp_job.py").read_text())
    spool = tmp_path / "spool"
    python = agent_venv / "bin" / "python"
    env = _clean_env(
        LOCKSTEP_OFFLINE="1",
        LOCKSTEP_SPOOL_DIR=str(spool),
        LOCKSTEP_RUN="from-wheel",
        LOCKSTEP_CACHE_DIR=str(tmp_path / "cache"),
        OMP_NUM_THREADS="1",
        TORCHINDUCTOR_COMPILE_THREADS="1",
        PYTHONFAULTHANDLER="1",
    )
    where = _run(
        [
            python,
            "-c",
            "import agents, lockstep_cli, msgspec, torch, sys; "
            "print(agents.__file__, lockstep_cli.__file__, torch.__version__, 'django' in sys.modules)",
        ],
        cwd=job,
        env=env,
    ).split()
    site = str(agent_venv / "lib")
    assert where[0].startswith(site) and where[1].startswith(site), where
    assert where[2].startswith("2.13.0") and where[3] == "False"
    assert "Lockstep per-rank agent" in _run([agent_venv / "bin" / "lockstep-agent", "--help"], cwd=job, env=env)
    assert "usage: lockstep" in _run([agent_venv / "bin" / "lockstep", "--help"], cwd=job, env=env)

    _run(
        torchrun(2, "ddp_job.py", *two_rank_job.ARGS, "--backend", "gloo", port=free_port(), python=python),
        cwd=job,
        env=env,
        timeout=240,
    )
    two_rank_job.check_spool(str(spool), "from-wheel")


def test_server_wheel_holds_settings_templates_static_and_migrations(dist, tmp_path):
    """`pip install .` builds this wheel; unpacked with --no-deps next to the test venv's packages
    (its pinned dependencies), Django finds everything in it, not in the tree."""
    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, _wheel(dist, "lockstep")])
    probe = (
        "import json, sys, django, dashboard\n"
        "django.setup()\n"
        "from django.conf import settings\n"
        "from django.contrib.staticfiles import finders\n"
        "from django.db.migrations.loader import MigrationLoader\n"
        "from django.template.loader import get_template\n"
        "import agents.fingerprint_native as fp\n"
        "disk = {k: m for k, m in MigrationLoader(None, ignore_no_migrations=True).disk_migrations.items()\n"
        "        if type(m).__module__.startswith(('dashboard.', 'ingest.'))}\n"
        "print(json.dumps({'dashboard': dashboard.__file__, 'template': get_template('dashboard/run.html').origin.name,\n"
        "    'login': get_template('registration/login.html').origin.name, 'static': finders.find('lockstep/run.js'),\n"
        "    'native_c': str(fp.SOURCE) if fp.SOURCE.is_file() else None, 'beat': settings.CELERY_BEAT_SCHEDULE_FILENAME,\n"
        "    'migrations': sorted(f'{app}.{name}' for app, name in disk),\n"
        "    'migration_files': sorted({sys.modules[type(m).__module__].__file__ for m in disk.values()})}))\n"
    )
    env = _clean_env(
        PYTHONPATH=str(target),
        DJANGO_SETTINGS_MODULE="dashboard.settings",
        SECRET_KEY="wheel-check",
        DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
        REDIS_URL="redis://127.0.0.1:1/0",
        LOCKSTEP_DATA_DIR=str(tmp_path / "data"),
    )
    env.pop("LOCKSTEP_BEAT_SCHEDULE", None)
    found = json.loads(_run([sys.executable, "-c", probe], cwd=tmp_path, env=env))
    for key in ("dashboard", "template", "login", "static", "native_c"):
        assert found[key] and found[key].startswith(str(target)), found
    assert all(f.startswith(str(target)) for f in found["migration_files"]), found["migration_files"]
    assert found["migrations"] == _tree_migrations()
    assert found["beat"] == str(tmp_path / "data" / "celerybeat-schedule")
    env.pop("LOCKSTEP_DATA_DIR")  # an installed server's default data folder: the user's, not site-packages
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME="")
    beat = _run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; "
            "print(settings.CELERY_BEAT_SCHEDULE_FILENAME)",
        ],
        cwd=tmp_path,
        env=env,
    ).strip()
    assert beat == str(tmp_path / "home" / ".local" / "share" / "lockstep" / "celerybeat-schedule")
    with zipfile.ZipFile(_wheel(dist, "lockstep")) as z:
        scripts = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
    assert "lockstep = lockstep_cli.main:main" in scripts and "lockstep-agent = agents.cli:main" in scripts
    assert [line for line in _metadata(_wheel(dist, "lockstep")) if line.startswith("Requires-Dist: torch")] == [
        f"Requires-Dist: {_pin('torch')}"
    ]


def _tree_migrations() -> list[str]:
    """app_label.migration of every migration file in the tree, as Django labels them."""
    from django.apps import apps

    labels = {str(Path(c.path).resolve()): c.label for c in apps.get_app_configs()}
    out = []
    for path in ROOT.glob("**/migrations/[0-9]*.py"):
        if ".venv" in path.parts or "site-packages" in path.parts:  # installed packages' own, not the tree's
            continue
        out.append(f"{labels[str(path.parent.parent.resolve())]}.{path.stem}")
    return sorted(out)
