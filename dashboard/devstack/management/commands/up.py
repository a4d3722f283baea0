"""`manage.py up`: the whole stack on one machine, plus live demo jobs.

Starts (or reuses) the database and Redis (embedded ones when DATABASE_URL / REDIS_URL are
unset), migrates, ensures a demo login and project, runs uvicorn and a Celery worker, then
launches real torchrun CPU jobs with the agent that provoke every divergence the CPU can, prints
each alert as it fires and as it resolves, and at the end which alert kinds the demo did not raise. Ctrl-C stops it all; the data folder is reused on the next start.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.launch import torchrun
from dashboard.detection import baseline
from dashboard.detection.models import Alert
from dashboard.detection.rules import REGISTRY
from dashboard.devstack import embedded
from dashboard.devstack.demo_jobs import demo_jobs
from dashboard.devstack.processes import kill_tree, server_command, stop_groups, worker_command
from dashboard.devstack.stream import AlertStream
from dashboard.tenancy.models import Project, ProjectToken, Run

DEMO_USER, DEMO_PASSWORD = "demo", "lockstep-demo"
SETTLE_GRACE_S = 15  # after the last demo job: the settle timeout plus a sweep


def raised_summary(raised: set[str]) -> str:
    """What the demo showed, from the alerts it raised: it never claims a kind it did not raise (the
    CPU cannot make every one, e.g. code baked for another GPU under one cache key)."""
    kinds = {r.kind for r in REGISTRY}
    missing = sorted(kinds - raised)
    said = f"{len(kinds & raised)} of {len(kinds)} alert kinds raised"
    return f"{said}; not raised here: {', '.join(missing)} (docs/alerts.md)" if missing else said


def demo_login(with_user: bool) -> str:
    """The demo project's token, and (`with_user`: only with the demo, in the embedded database of the
    data folder, on a loopback address) the user demo / lockstep-demo, a public password: a member of
    the demo project and nothing more (no admin), never in a database of someone's own."""
    project, _ = Project.named("demo")
    if with_user:
        user = User.objects.filter(username=DEMO_USER).first()
        if user is None:
            user = User.objects.create_user(DEMO_USER, password=DEMO_PASSWORD)
        project.members.add(user)
    return ProjectToken.issue(project)


def port_taken(host: str, port: int) -> str:
    """Why the server could not listen on host:port ("" when it can): checked before anything starts, so
    a second stack on a taken port says so instead of reporting itself up."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: TIME_WAIT does not count
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""


def is_loopback(host: str) -> bool:
    """Whether `--host` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def refuse_demo_password() -> bool:
    """On an address others reach, the public demo password must open nothing: a demo user left by an
    earlier loopback start gets an unusable password. Whether there was one to refuse."""
    user = User.objects.filter(username=DEMO_USER).first()
    if user is None or not user.check_password(DEMO_PASSWORD):
        return False
    user.set_unusable_password()
    user.save(update_fields=["password"])
    return True


class Command(BaseCommand):
    help = "Start Lockstep (server, Celery worker, embedded services) and live demo jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=settings.LOCKSTEP_PORT)
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--no-demo", action="store_true", help="start the stack only")
        parser.add_argument("--ranks", type=int, default=3, help="ranks of each demo job")

    def handle(self, *args: object, port: int, host: str, no_demo: bool, ranks: int, **options: Any) -> None:
        self.children: list[subprocess.Popen[bytes]] = []
        self.stopping = threading.Event()
        # Ctrl-C and SIGTERM set a flag the watch loop checks: no exception landing mid-query, and
        # it works where SIGINT arrives ignored (a shell's background jobs start with SIG_IGN,
        # which Python keeps, so `up &` never saw Ctrl-C: found when the test hung in CI).
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.stopping.set())
        busy = port_taken(host, port)
        if busy:
            self.stop_embedded()
            raise CommandError(
                f"{host}:{port} is taken ({busy}): stop what listens there or pick another port (--port or PORT)"
            )
        self.say(f"data folder {settings.DATA_DIR}; database and Redis ready")
        call_command("migrate", interactive=False, verbosity=0)
        token, demo_user = self.logins(host, no_demo)
        # The children's environment: ours, the services' URLs, and a quicker rank_silent for the demo.
        env = {
            "LOCKSTEP_SILENT_AFTER": "15",
            **os.environ,
            "DATABASE_URL": settings.DATABASE_URL,
            "REDIS_URL": settings.REDIS_URL,
            "PYTHONUNBUFFERED": "1",
        }
        self.url = f"http://{host}:{port}"
        try:
            services = [
                self.start(
                    "server",
                    server_command(host, port),
                    env,
                ),
                self.start(
                    "worker",
                    worker_command(),
                    env,
                ),  # beat's file: CELERY_BEAT_SCHEDULE_FILENAME
            ]
            if not self.wait_listening(host, port, services[0]):
                log = settings.DATA_DIR / "server.log"
                raise CommandError(f"the server did not start; the end of {log}:\n{embedded.log_tail(log)}")
            login = (
                f"login: {DEMO_USER} / {DEMO_PASSWORD}"
                if demo_user
                else "no demo login (--no-demo, an address others reach, or a database of your own): manage.py createsuperuser adds yours"
            )
            self.say(f"Lockstep is up: {self.url}/   {login}")
            self.say(f"ingest token for project 'demo': {token}")
            if not no_demo:
                threading.Thread(target=self.run_demo, args=(env, token, ranks), daemon=True).start()
            self.say("press Ctrl-C to stop")
            self.watch(services)
        finally:
            self.stopping.set()
            self.stop_children()
            self.stop_embedded()

    def logins(self, host: str, no_demo: bool) -> tuple[str, bool]:
        """The demo project's token, and whether the public demo login exists: only with the demo, in
        the embedded database, on a loopback address; on any other address its password is refused."""
        demo_user = settings.LOCKSTEP_EMBEDDED and not no_demo and is_loopback(host)
        token = demo_login(demo_user)
        if not is_loopback(host) and refuse_demo_password():
            self.say(f"the demo user's public password is refused on {host} (set one: manage.py changepassword demo)")
        return token, demo_user

    def say(self, text: str) -> None:
        self.stdout.write(f"[lockstep {time.strftime('%H:%M:%S')}] {text}")
        self.stdout.flush()

    def start(self, name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(settings.DATA_DIR / f"{name}.log", "ab")
        child = subprocess.Popen(
            args, cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.children.append(child)
        return child

    def wait_listening(self, host: str, port: int, server: subprocess.Popen[bytes], timeout: float = 120) -> bool:
        """Whether the server accepts connections (so the URL printed next works when opened); False
        once it exited or `timeout` passed. Ctrl-C returns True: the watch loop then stops at once."""
        deadline = time.monotonic() + timeout
        while server.poll() is None and time.monotonic() < deadline:
            if self.stopping.is_set():
                return True
            try:
                socket.create_connection((host, port), timeout=1).close()
                return True
            except OSError:
                self.stopping.wait(0.2)
        return False

    def watch(self, services: list[subprocess.Popen[bytes]]) -> None:
        """Print every alert of the demo project as it fires and as it resolves (`stream.AlertStream`);
        stop if a service dies."""
        alerts = Alert.objects.select_related("run").filter(run__project__name="demo").order_by("id")
        printer = AlertStream()
        printer.known(alerts)
        while all(service.poll() is None for service in services):
            for text in printer.lines(alerts.all()):
                self.say(text)
            if self.stopping.wait(1):
                self.say("stopping")
                return
        self.say("a stack process exited (see the logs in the data folder); stopping")

    def run_demo(self, env: dict[str, str], token: str, ranks: int) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        data = str(settings.DATA_DIR)
        for name in ("cold", "shared"):
            shutil.rmtree(f"{data}/demo-cache-{name}", ignore_errors=True)
        for job in demo_jobs(data):
            if self.stopping.is_set():
                return
            key = f"demo-{job.name}-{stamp}"
            self.say(f"demo job '{job.name}': {job.what}  ->  {self.url}/runs/{key}/")
            if job.baseline:
                self.link_baseline(key, f"demo-{job.baseline}-{stamp}")
            job_env = dict(
                env,
                LOCKSTEP_URL=self.url,
                LOCKSTEP_TOKEN=token,
                LOCKSTEP_RUN=key,
                LOCKSTEP_RUN_NAME=f"demo {job.name}",
                LOCKSTEP_SPOOL_DIR=f"{data}/spool",
                LOCKSTEP_HEARTBEAT="1",
                OMP_NUM_THREADS="1",
                **job.env,
            )
            if job.before:
                subprocess.run(
                    job.before,
                    cwd=settings.BASE_DIR,
                    env={**job_env, **job.before_env, "LOCKSTEP_DISABLE": "1"},
                    capture_output=True,
                )
            args = torchrun(ranks, job.script, *job.args, port=29500 + os.getpid() % 1000, agent=job.via_agent_cli)
            child = self.start(f"demo-{job.name}", args, job_env)
            try:
                child.wait(job.max_seconds)
            except subprocess.TimeoutExpired:
                kill_tree(child)
            self.say(f"demo job '{job.name}' ended")
        self.stopping.wait(SETTLE_GRACE_S)  # the last job's slots settle, its incidents open
        raised = set(Alert.objects.filter(run__key__endswith=f"-{stamp}").values_list("kind", flat=True))
        self.say(f"all demo jobs done: {raised_summary(raised)}; compare the first two runs on the compare page")

    def link_baseline(self, key: str, baseline_key: str) -> None:
        """Mark the earlier run as the baseline of this one (the run row appears with its first batch)."""

        def link() -> None:
            for _ in range(120):
                run, base = Run.objects.filter(key=key).first(), Run.objects.filter(key=baseline_key).first()
                if run and base:
                    baseline.suggest(run, base)
                    return
                time.sleep(0.5)

        threading.Thread(target=link, daemon=True).start()

    def stop_children(self) -> None:
        stop_groups(self.children)
        self.say("stopped")

    def stop_embedded(self) -> None:
        """Embedded servers were started for this stack: stop them too (their data stays)."""
        if not settings.LOCKSTEP_EMBEDDED:
            return
        embedded.stop(settings.DATA_DIR)
        self.say(f"embedded PostgreSQL and Redis stopped; data kept in {settings.DATA_DIR}")
