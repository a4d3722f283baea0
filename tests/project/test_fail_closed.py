"""Defaults that fail closed (issue 17, item 7): no public secret key, no database started from half a
configuration, `manage.py up` adds its public demo login only to its own embedded database, and
secure cookies and HSTS where the deployment says browsers come over HTTPS; reading the settings
starts and makes nothing.

Neither URL set is the embedded development stack (README command 1, `tests/devstack/test_up.py`)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from dashboard.devstack.management.commands.up import demo_login
from dashboard.tenancy.models import Project

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import django; django.setup(); from django.conf import settings as s; "
    "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, "
    "getattr(s, 'SECURE_PROXY_SSL_HEADER', None), s.SECRET_KEY)"
)
SERVICES = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/lockstep", "REDIS_URL": "redis://127.0.0.1:6379/0"}


def _settings(tmp_path: Path, probe: str = PROBE, **env: str) -> subprocess.CompletedProcess:
    """Run `probe` (by default: load the settings) in a fresh process with only `env` (plus what Python needs)."""
    base = {
        "PATH": os.environ["PATH"],
        "DJANGO_SETTINGS_MODULE": "dashboard.settings",
        "PYTHONPATH": str(ROOT),
        "LOCKSTEP_DATA_DIR": str(tmp_path / "var"),
    }
    return subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60
    )


def test_without_secret_key_each_data_folder_gets_its_own_private_key(tmp_path):
    first, second = _settings(tmp_path, **SERVICES), _settings(tmp_path, **SERVICES)
    assert first.returncode == 0 and second.returncode == 0, first.stderr
    key = first.stdout.split()[-1]
    assert key == second.stdout.split()[-1] and len(key) >= 50  # every process of the folder signs alike
    stored = tmp_path / "var" / "secret_key"
    assert stored.read_text().strip() == key and stat.S_IMODE(stored.stat().st_mode) == 0o600
    other = tmp_path / "other"
    elsewhere = _settings(other, **SERVICES).stdout.split()[-1]
    assert elsewhere != key  # no value shared by every installation, as a default in the code would be
    given = _settings(tmp_path / "given", SECRET_KEY="k" * 50, **SERVICES)
    assert given.stdout.split()[-1] == "k" * 50 and not (tmp_path / "given" / "var" / "secret_key").exists()


def test_half_a_configuration_refuses_to_start_and_starts_no_database(tmp_path):
    for half in ({"REDIS_URL": SERVICES["REDIS_URL"]}, {"DATABASE_URL": SERVICES["DATABASE_URL"]}):
        refused = _settings(tmp_path, SECRET_KEY="k" * 50, **half)
        assert refused.returncode != 0 and "set both DATABASE_URL and REDIS_URL, or neither" in refused.stderr
    assert not (tmp_path / "var").exists()  # nothing was started or created


def test_loading_the_settings_with_neither_url_starts_nothing_and_points_at_the_embedded_servers(tmp_path):
    probe = "import django; django.setup(); from django.conf import settings as s; print(s.DATABASE_URL); print(s.REDIS_URL)"
    loaded = _settings(tmp_path, probe, SECRET_KEY="k" * 50)
    assert loaded.returncode == 0, loaded.stderr
    database_url, redis_url = loaded.stdout.split()
    assert (
        database_url.startswith("postgresql://postgres@/lockstep?host=")
        and str(tmp_path / "var" / "pg") in database_url
    )
    assert redis_url == "redis://127.0.0.1:6390/0"
    assert not (tmp_path / "var" / "pg").exists() and not (tmp_path / "var" / "redis").exists()  # `up` starts them


def test_https_deployments_get_secure_cookies_hsts_and_a_proxy_header_only_when_named(tmp_path):
    plain = _settings(tmp_path, SECRET_KEY="k" * 50, **SERVICES)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split()[:4] == ["False", "False", "0", "None"]  # plain HTTP keeps its logins
    https = _settings(tmp_path, SECRET_KEY="k" * 50, LOCKSTEP_HTTPS="1", **SERVICES)
    assert https.stdout.split()[:4] == ["True", "True", "31536000", "None"]
    proxied = _settings(
        tmp_path, SECRET_KEY="k" * 50, LOCKSTEP_HTTPS="1", LOCKSTEP_PROXY_TLS_HEADER="X-Forwarded-Proto", **SERVICES
    )
    assert "('HTTP_X_FORWARDED_PROTO', 'https')" in proxied.stdout


@pytest.mark.django_db
def test_the_public_demo_login_goes_only_into_the_embedded_database():
    assert demo_login(with_user=False).startswith("lst_")
    assert not User.objects.filter(username="demo").exists()
    demo_login(with_user=True)
    assert Project.objects.get(name="demo").members.get().username == "demo"


@pytest.mark.django_db
def test_metrics_token_is_compared_in_constant_time_and_any_text_is_a_401(client, settings):
    settings.LOCKSTEP_METRICS_TOKEN = "metrics-secret"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer m\u00e9trics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer metrics-secret").status_code == 200


def test_reading_the_settings_makes_no_folder(tmp_path):
    """The data folder, the static root and beat's schedule folder are made by what uses them (the web
    app, beat as it opens its file, `manage.py up`), never by reading the settings."""
    beat = tmp_path / "beat" / "state" / "schedule"
    probe = "from django.conf import settings as s; print(s.STATIC_ROOT, s.CELERY_BEAT_SCHEDULE_FILENAME)"
    loaded = _settings(tmp_path, probe, SECRET_KEY="k" * 50, LOCKSTEP_BEAT_SCHEDULE=str(beat), **SERVICES)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == [str(tmp_path / "var" / "static"), str(beat)]
    assert list(tmp_path.iterdir()) == []
