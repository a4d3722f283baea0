"""Defaults that fail closed (issue 17, item 7): production settings refuse to start without a
secret key and the services' URLs, `manage.py up` adds its public demo login only to its own
embedded database, and browsers get secure cookies and HSTS unless told otherwise."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from dashboard.devstack.management.commands.up import demo_login
from dashboard.tenancy.models import Project

ROOT = Path(__file__).resolve().parent.parent
PROBE = ("import django; django.setup(); from django.conf import settings as s; "
         "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_HSTS_SECONDS, getattr(s, 'SECURE_PROXY_SSL_HEADER', None))")
SERVICES = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/lockstep", "REDIS_URL": "redis://127.0.0.1:6379/0"}


def _settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """Load the settings in a fresh process with only `env` (plus what Python needs)."""
    base = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "dashboard.settings", "PYTHONPATH": str(ROOT),
            "LOCKSTEP_DATA_DIR": str(tmp_path / "var")}
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**base, **env}, capture_output=True,
                          text=True, timeout=60)


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    refused = _settings(tmp_path, **SERVICES)
    assert refused.returncode != 0 and "SECRET_KEY must be set" in refused.stderr


def test_production_refuses_to_start_an_embedded_database_unasked(tmp_path):
    refused = _settings(tmp_path, SECRET_KEY="k" * 50, REDIS_URL=SERVICES["REDIS_URL"])
    assert refused.returncode != 0 and "DATABASE_URL and REDIS_URL must be set" in refused.stderr
    assert not (tmp_path / "var").exists()  # nothing was started or created


def test_production_cookies_are_secure_with_hsts_and_a_proxy_header_only_when_named(tmp_path):
    served = _settings(tmp_path, SECRET_KEY="k" * 50, **SERVICES)
    assert served.returncode == 0, served.stderr
    assert served.stdout.split() == ["True", "True", "31536000", "None"]
    proxied = _settings(tmp_path, SECRET_KEY="k" * 50, LOCKSTEP_PROXY_TLS_HEADER="X-Forwarded-Proto", **SERVICES)
    assert "('HTTP_X_FORWARDED_PROTO', 'https')" in proxied.stdout
    plain = _settings(tmp_path, SECRET_KEY="k" * 50, LOCKSTEP_HTTPS="0", **SERVICES)
    assert plain.stdout.split() == ["False", "False", "0", "None"]


def test_development_mode_is_asked_for_and_keeps_plain_http(tmp_path):
    dev = _settings(tmp_path, LOCKSTEP_DEV="1", **SERVICES)
    assert dev.returncode == 0, dev.stderr
    assert dev.stdout.split()[:2] == ["False", "False"]


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
