"""Settings from the environment.

DATABASE_URL / REDIS_URL point at real servers. With neither set, they point at the embedded
PostgreSQL and Redis of LOCKSTEP_DATA_DIR (default ./var), which `manage.py up` starts from pip
packages, so a newcomer needs nothing but Python (docs/design.md, Development stack); importing
these settings starts nothing. With only one set, they refuse to load: half a configuration is a
mistake, never a reason to start a database. SECRET_KEY comes
from the environment, else from a key generated once for the data folder: never a public value.
There is no SQLite, in-memory channel layer or eager Celery path.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

from agents import protocol
from dashboard import metrics_folder
from dashboard.devstack import embedded

BASE_DIR = Path(__file__).resolve().parent.parent


DATA_DIR = Path(os.environ.get("LOCKSTEP_DATA_DIR") or embedded.default_data_dir(BASE_DIR))


def _env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, "1" if default else "0").lower() in {"1", "true", "yes", "on"}


def _database(url: str) -> dict[str, Any]:
    """Django DATABASES entry for a postgresql:// URL (host may be a socket dir in ?host=)."""
    parts = urlparse(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise RuntimeError(f"DATABASE_URL must be a postgresql:// URL, got {parts.scheme!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "lockstep",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": query.pop("host", parts.hostname or ""),
        "PORT": str(parts.port or query.pop("port", "") or ""),
        "CONN_MAX_AGE": 0,  # pooled (LOCKSTEP_DB_POOL, below)
        "CONN_HEALTH_CHECKS": True,  # the pool checks a connection before handing it out
        "OPTIONS": query,
        "TEST": {"NAME": os.environ.get("LOCKSTEP_TEST_DB")},  # per-process test DB (tests/service_env.py)
    }


def _service_urls() -> tuple[str, str]:
    database_url = os.environ.get("DATABASE_URL", "")
    redis_url = os.environ.get("REDIS_URL", "")
    if database_url and redis_url:
        return database_url, redis_url
    if database_url or redis_url:
        raise ImproperlyConfigured(
            f"set both DATABASE_URL and REDIS_URL, or neither for the embedded development servers under {DATA_DIR}"
        )
    return embedded.addresses(DATA_DIR)  # `manage.py up` starts them; here nothing starts


def _secret_key() -> str:
    """SECRET_KEY, else one generated for this data folder on first use (mode 0600) and read by every
    process that shares the folder. Hosts that share no folder must share SECRET_KEY (docs/operating.md)."""
    if key := os.environ.get("SECRET_KEY", ""):
        return key
    path = DATA_DIR / "secret_key"
    if not path.exists():
        try:
            DATA_DIR.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=DATA_DIR, delete=False) as tmp:  # mode 0600
                tmp.write(secrets.token_urlsafe(50))
            try:
                os.link(tmp.name, path)  # atomic, and only the first of processes starting together wins
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp.name)
        except OSError as exc:
            raise ImproperlyConfigured(f"set SECRET_KEY, or let Lockstep keep one in {DATA_DIR}: {exc}") from exc
    return path.read_text().strip()


DATABASE_URL, REDIS_URL = _service_urls()
LOCKSTEP_EMBEDDED = not os.environ.get("DATABASE_URL")  # `manage.py up` stops them; only there it adds its demo login
LOCKSTEP_PORT = int(os.environ.get("PORT", "8000"))  # default of `manage.py up --port`

SECRET_KEY = _secret_key()
DEBUG = _env_bool("DEBUG", False)
ALLOWED_HOSTS = [
    h.strip() for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# A deployment that browsers reach over HTTPS sets LOCKSTEP_HTTPS=1: cookies only over TLS, and HSTS.
# Off by default: on plain HTTP (a cluster-internal address, the development stack) secure cookies
# would never come back and nobody could log in. Behind a TLS-terminating proxy,
# LOCKSTEP_PROXY_TLS_HEADER names the header it sets to "https" (e.g. X-Forwarded-Proto); only set it
# when the proxy overwrites that header.
LOCKSTEP_HTTPS = _env_bool("LOCKSTEP_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = LOCKSTEP_HTTPS
SECURE_HSTS_SECONDS = int(os.environ.get("LOCKSTEP_HSTS_SECONDS", "31536000")) if LOCKSTEP_HTTPS else 0
_PROXY_TLS_HEADER = os.environ.get("LOCKSTEP_PROXY_TLS_HEADER", "")
if _PROXY_TLS_HEADER:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _PROXY_TLS_HEADER.upper().replace("-", "_"), "https")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "dashboard.tenancy",
    "dashboard.ledger",
    "dashboard.evidence",
    "ingest",
    "dashboard.detection",
    "dashboard.delivery",
    "dashboard.web",
    "dashboard.devstack",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "dashboard.web.input_bounds.InputBounds",  # before the session's lookup: a NUL or an id no column holds is a 4xx
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "dashboard.web.middleware.StatementTimeout",
    "dashboard.web.middleware.ContentSecurityPolicy",
    "axes.middleware.AxesMiddleware",  # last: turns a locked-out login into its 429
]
# Login throttling (django-axes, /login/ and /admin/ alike): after LOCKSTEP_LOGIN_FAILURES wrong passwords
# for one user name from one address, or from one address whatever the names, every login of that user
# from that address, or from that address, is refused (429) for LOCKSTEP_LOGIN_COOLOFF minutes, the right
# password too. Never per user name alone: anyone who knows a name could lock its user out everywhere.
# Counted in PostgreSQL: all processes share it.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = int(os.environ.get("LOCKSTEP_LOGIN_FAILURES", "5"))
AXES_COOLOFF_TIME = float(os.environ.get("LOCKSTEP_LOGIN_COOLOFF", "15")) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]  # per (user, address) and per address
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
AXES_CLIENT_IP_CALLABLE = "dashboard.web.middleware.client_ip"  # the edge's address, never a header
# Every page's Content-Security-Policy (dashboard/web/middleware.py): no inline or foreign script.
LOCKSTEP_CSP = os.environ.get("LOCKSTEP_CSP") or (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"
)

ROOT_URLCONF = "dashboard.urls"
ASGI_APPLICATION = "dashboard.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": _database(DATABASE_URL)}
# Every process (uvicorn's, a Celery worker's prefork children, beat, manage.py commands) takes its
# PostgreSQL sessions from one psycopg pool of at most LOCKSTEP_DB_POOL connections (unset or 0: 8),
# whatever its load: under ASGI each request's sync code runs on a thread of its own, and Django's
# per-thread connections without a pool grew with the load until PostgreSQL refused every client of
# the server ("too many clients already"), other databases' too. A request that finds every pooled
# connection taken waits LOCKSTEP_DB_POOL_TIMEOUT seconds for one, then gets a 503 with Retry-After
# (dashboard/web/middleware.py; ingest answers its own 503). A pooled connection unused for
# LOCKSTEP_DB_POOL_IDLE seconds is closed (one per such interval), so a quiet process holds none.
# Sizing: docs/operating.md (processes x LOCKSTEP_DB_POOL below PostgreSQL's max_connections).
DEFAULT_DB_POOL = 8
LOCKSTEP_DB_POOL = int(os.environ.get("LOCKSTEP_DB_POOL", "0") or "0") or DEFAULT_DB_POOL
LOCKSTEP_DB_POOL_TIMEOUT = float(os.environ.get("LOCKSTEP_DB_POOL_TIMEOUT", "5"))
LOCKSTEP_DB_POOL_IDLE = float(os.environ.get("LOCKSTEP_DB_POOL_IDLE", "60"))
if LOCKSTEP_DB_POOL < 0 or LOCKSTEP_DB_POOL_TIMEOUT <= 0 or LOCKSTEP_DB_POOL_IDLE <= 0:
    raise ImproperlyConfigured(
        "LOCKSTEP_DB_POOL must be a number of connections (0: the default, 8), and LOCKSTEP_DB_POOL_TIMEOUT"
        " and LOCKSTEP_DB_POOL_IDLE positive seconds"
    )
DATABASES["default"]["CONN_MAX_AGE"] = 0  # a pooled connection goes back to the pool after each request
# reconnect_timeout: psycopg_pool retries a failed connect with doubling delays, so after an outage of
# t seconds its next attempt could come t seconds after PostgreSQL is back, past a waiter's timeout; giving
# up after 2 s lets the next request's checkout connect at once (every request of an outage is a 503 anyway)
DATABASES["default"]["OPTIONS"]["pool"] = {
    "min_size": 0,
    "max_size": LOCKSTEP_DB_POOL,
    "timeout": LOCKSTEP_DB_POOL_TIMEOUT,
    "max_idle": LOCKSTEP_DB_POOL_IDLE,
    "reconnect_timeout": 2,
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CHANNEL_LAYERS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py >= 8 times reads out after 5 s by default, exactly channels_redis' 5 s BZPOPMIN:
        # idle websocket consumers would die with TimeoutError. Give reads headroom.
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "capacity": 1000},
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Priorities (0 the top; dashboard/detection/fairness.py): an alert's way to its destinations at 0, so a
# page never waits behind the settles queued before it; every other task at 1, and a run with a backlog
# of slots queues its settles lower.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 300, "priority_steps": [0, 1, 3, 6, 9]}
CELERY_TASK_DEFAULT_PRIORITY = 1
CELERY_IMPORTS = ("dashboard.evidence.tasks",)
# The sweeps' period; past 5 without one completed, the sweep counts as stopped (detection/sweep_clock.py).
SWEEP_PERIOD_S = 2.0
CELERY_BEAT_SCHEDULE = {
    # A sweep not started within its interval is dropped (workers down): the next one does its work.
    "settle-overdue-slots": {
        "task": "dashboard.detection.tasks.sweep",
        "schedule": SWEEP_PERIOD_S,
        "options": {"expires": SWEEP_PERIOD_S},
    },
    "deliver-pending-alerts": {
        "task": "dashboard.delivery.tasks.sweep",
        "schedule": SWEEP_PERIOD_S,
        "options": {"expires": SWEEP_PERIOD_S},
    },
    "prune-raw-partitions": {"task": "dashboard.evidence.tasks.prune_raw", "schedule": 3600.0},
}
# Beat's own state (`worker -B`, `celery beat`): in the data folder or at LOCKSTEP_BEAT_SCHEDULE, never
# in whatever folder the worker was started from (a `--schedule` flag still overrides it).
CELERY_BEAT_SCHEDULE_FILENAME = os.environ.get("LOCKSTEP_BEAT_SCHEDULE") or str(DATA_DIR / "celerybeat-schedule")
CELERY_BEAT_SCHEDULER = "dashboard.beat_schedule:Scheduler"  # makes the schedule file's folder as it opens it

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

STATIC_URL = "/static/"
# collectstatic's target (the web app makes it); WhiteNoise serves the apps' static files from finders
STATIC_ROOT = DATA_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"

# Detection: a slot settles when every rank reported it, or this long after its first report.
LOCKSTEP_SETTLE_TIMEOUT = float(os.environ.get("LOCKSTEP_SETTLE_TIMEOUT", "10"))
LOCKSTEP_SILENT_AFTER = float(os.environ.get("LOCKSTEP_SILENT_AFTER", "60"))
# A rank still "running" this long after every peer ended, without a word, is lost (killed outright).
# Must exceed two agent heartbeats (5 s each by default).
LOCKSTEP_LOST_AFTER = float(os.environ.get("LOCKSTEP_LOST_AFTER", "12"))
# How long a rank that lost its peer (or was stopped by a signal) waits for the rank it lost to be
# known before it is paged as a root of its own.
LOCKSTEP_CONSEQUENCE_GRACE = float(os.environ.get("LOCKSTEP_CONSEQUENCE_GRACE", "20"))
LOCKSTEP_PUBLIC_URL = os.environ.get("LOCKSTEP_PUBLIC_URL", "").rstrip("/")
# Alert destinations (Slack, Alertmanager, PagerDuty, JSON webhooks) on loopback, private or link-local
# addresses are refused unless this is set (an in-cluster Alertmanager needs it): the URL is checked
# when saved and, after DNS resolution, at every send.
LOCKSTEP_SINKS_ALLOW_PRIVATE = _env_bool("LOCKSTEP_SINKS_ALLOW_PRIVATE", False)
LOCKSTEP_MAX_BODY = int(
    os.environ.get("LOCKSTEP_MAX_BODY", protocol.MAX_BODY_BYTES)
)  # bytes, compressed or not; 413 past it
LOCKSTEP_PAGE_STATEMENT_TIMEOUT = float(
    os.environ.get("LOCKSTEP_PAGE_STATEMENT_TIMEOUT", "10")
)  # s per statement of a page or read-API request
LOCKSTEP_BODY_TIMEOUT = float(os.environ.get("LOCKSTEP_BODY_TIMEOUT", "30"))  # seconds to receive a body; 408 past it
# Request bodies of pages, login, admin and the read API (dashboard/web/edge.py) read at once per server
# process, before Django knows who sent them; past it a 503 + Retry-After at once.
LOCKSTEP_EDGE_BODIES = int(os.environ.get("LOCKSTEP_EDGE_BODIES", "128"))
# Request bodies of the agents' endpoints (ingest/door.py) read at once per server process, in all and per
# project (each up to LOCKSTEP_MAX_BODY, sent by anyone with a token); past either a 503 + Retry-After at once.
LOCKSTEP_DOOR_BODIES = int(os.environ.get("LOCKSTEP_DOOR_BODIES", "32"))
LOCKSTEP_DOOR_BODIES_PER_PROJECT = int(os.environ.get("LOCKSTEP_DOOR_BODIES_PER_PROJECT", "8"))
# Seconds a connection has to deliver a request's headers (dashboard/web/header_deadline.py); then it is closed.
LOCKSTEP_HEADER_TIMEOUT = float(os.environ.get("LOCKSTEP_HEADER_TIMEOUT", "10"))
# Proxies whose X-Forwarded-For is believed (IPs or CIDRs, comma-separated; none by default): the client's
# address (login throttling, logs) is the socket's peer unless that is one of them (dashboard/web/edge.py).
LOCKSTEP_TRUSTED_PROXIES = [p.strip() for p in os.environ.get("LOCKSTEP_TRUSTED_PROXIES", "").split(",") if p.strip()]
# Every session of the servers and Celery workers (dashboard/apps.py: bound_sessions): seconds a statement may
# wait for a lock, and may run; past them ingest answers 503 + Retry-After and a task fails (the sweep redoes it).
LOCKSTEP_DB_LOCK_TIMEOUT = float(os.environ.get("LOCKSTEP_DB_LOCK_TIMEOUT", "2"))
LOCKSTEP_DB_STATEMENT_TIMEOUT = float(os.environ.get("LOCKSTEP_DB_STATEMENT_TIMEOUT", "30"))

# Ingest at scale (ingest/): raw retention, load shedding, outage answers, blob leases, metrics.
LOCKSTEP_RAW_RETENTION_DAYS = float(os.environ.get("LOCKSTEP_RAW_RETENTION_DAYS", "14"))
LOCKSTEP_RATE_LIMIT = int(os.environ.get("LOCKSTEP_RATE_LIMIT", "5000"))  # batches/s per project; 0 = off
LOCKSTEP_RETRY_AFTER = int(os.environ.get("LOCKSTEP_RETRY_AFTER", "5"))  # seconds, on 503
LOCKSTEP_BLOB_LEASE = float(
    os.environ.get("LOCKSTEP_BLOB_LEASE", "60")
)  # seconds one agent has to upload a wanted blob
# Graph texts a project may keep (ingest/blobs.py, the policy; dashboard/evidence/blobs.py, the table): bytes in all and stored within a day
# (its Flight Recorder dumps counted too, ingest/quotas.py), and texts asked per run.
# Past them the server asks for none and refuses uploads, texts or dumps (507 for the total, 429 for the day); agents drop them.
LOCKSTEP_BLOB_QUOTA = int(os.environ.get("LOCKSTEP_BLOB_QUOTA", str(1024 * 1024 * 1024)))
LOCKSTEP_BLOB_QUOTA_DAY = int(os.environ.get("LOCKSTEP_BLOB_QUOTA_DAY", str(256 * 1024 * 1024)))
LOCKSTEP_BLOB_ASKS_PER_RUN = int(os.environ.get("LOCKSTEP_BLOB_ASKS_PER_RUN", "1000"))
# Rows a project's token can make (ingest/quotas.py): new runs within an hour (429 past it) and ranks of a run (400).
LOCKSTEP_RUNS_PER_HOUR = int(os.environ.get("LOCKSTEP_RUNS_PER_HOUR", "600"))
# alerts one run keeps one by one; past it each kind's further findings are counted in one alert
LOCKSTEP_ALERTS_PER_RUN = int(os.environ.get("LOCKSTEP_ALERTS_PER_RUN", "200"))
# the widest jobs the product is built for (100k GPUs and more); a team that wants a lower bound sets one
LOCKSTEP_MAX_RANKS = int(os.environ.get("LOCKSTEP_MAX_RANKS", "131072"))
LOCKSTEP_METRICS_TOKEN = os.environ.get("LOCKSTEP_METRICS_TOKEN", "")  # /metrics needs it as bearer token
# /metrics names every project and run: refused (403) until LOCKSTEP_METRICS_TOKEN is set, unless made public on purpose
LOCKSTEP_METRICS_PUBLIC = _env_bool("LOCKSTEP_METRICS_PUBLIC", False)
LOCKSTEP_METRICS_RUNS = int(
    os.environ.get("LOCKSTEP_METRICS_RUNS", "20")
)  # active runs with per-run series on /metrics, newest first
# prometheus_client reads it too (at import, to pick per-process files); /metrics sums those files when set.
# Unset, the workers of one `uvicorn --workers N` share DATA_DIR/prometheus/<server> (dashboard/metrics_folder.py).
PROMETHEUS_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "") or metrics_folder.workers_folder(DATA_DIR)
if PROMETHEUS_MULTIPROC_DIR:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = PROMETHEUS_MULTIPROC_DIR  # where prometheus_client looks, on its import
# The variables a destinations file names as ${NAME} (`manage.py sinks apply`, dashboard/delivery/sinks_file.py).
SINKS_FILE_VARIABLES = os.environ
# Threads of the agents' door (ingest/door.py) per ASGI process (default 16): blob and flight-record
# uploads, token lookups that miss the cache, and decoding bodies over 256 KiB.
LOCKSTEP_INGEST_THREADS = int(os.environ.get("LOCKSTEP_INGEST_THREADS", "0")) or 16
# Group-commit writer threads per ASGI process (ingest/groupcommit.py): groups of one process written
# at once, each on a pooled connection of its own (keep LOCKSTEP_DB_POOL above it).
LOCKSTEP_INGEST_WRITERS = max(1, int(os.environ.get("LOCKSTEP_INGEST_WRITERS", "2")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "axes": {"level": "WARNING"},
    },  # axes: every login at INFO
}

# hang_forecast: warn once ranks have waited this long in a collective for a late rank (critical at half
# the collective timeout). With 5 s agent heartbeats and the 2 s sweep, the alert reaches the page
# about this long plus 1-3 s after the stall (P8 <= 15 s).
LOCKSTEP_HANG_WARN_AFTER = float(os.environ.get("LOCKSTEP_HANG_WARN_AFTER", "10"))
# compile_cost: warn when the compile bill passes this share of the GPU time a run has had, once the run is
# this many seconds old (docs/cost.md).
LOCKSTEP_COMPILE_BUDGET = float(os.environ.get("LOCKSTEP_COMPILE_BUDGET", "0.10"))
LOCKSTEP_COMPILE_BUDGET_AFTER = float(os.environ.get("LOCKSTEP_COMPILE_BUDGET_AFTER", "600"))
# hang_forecast asks the live ranks for Flight Recorder dumps; torch's analysis of them runs once all
# answered, or this many seconds after asking with the ranks that did.
LOCKSTEP_FR_WAIT = float(os.environ.get("LOCKSTEP_FR_WAIT", "10"))
