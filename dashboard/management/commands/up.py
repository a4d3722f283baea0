"""`manage.py up`: the whole stack on one machine, plus a live demo job.

Starts (or reuses) the database and Redis (embedded ones when DATABASE_URL / REDIS_URL are
unset), migrates, ensures a demo login and project, runs uvicorn and a Celery worker, then
launches real torchrun CPU jobs with the agent that provoke divergences. Ctrl-C stops it all;
the data folder is reused on the next start.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand

from ingest.models import Project, ProjectToken

DEMO_JOBS = {
    "demo-divergence": ["--steps", "40", "--sleep", "0.5", "--shape-rank", "1", "--shape-step", "5",
                        "--perturb-rank", "2", "--perturb-step", "12"],
}


class Command(BaseCommand):
    help = "Start Lockstep (server, Celery worker, embedded services) and a live demo job."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--no-demo", action="store_true", help="start the stack only")
        parser.add_argument("--ranks", type=int, default=3, help="ranks of the demo job")

    def handle(self, *args, port: int, host: str, no_demo: bool, ranks: int, **options) -> None:
        self.children: list[subprocess.Popen] = []
        self.services: list[subprocess.Popen] = []
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        self.say(f"data folder {settings.DATA_DIR}; database and Redis ready")
        call_command("migrate", interactive=False, verbosity=0)
        user, password, token = self.demo_login()
        env = dict(os.environ, DATABASE_URL=settings.DATABASE_URL, REDIS_URL=settings.REDIS_URL, PYTHONUNBUFFERED="1")
        url = f"http://{host}:{port}"
        try:
            self.services.append(self.start("server", [sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--host", host,
                                  "--port", str(port), "--log-level", "warning"], env))
            self.services.append(self.start("worker", [sys.executable, "-m", "celery", "-A", "dashboard", "worker", "-B", "--concurrency", "1",
                                  "--loglevel", "warning", "--schedule", str(settings.DATA_DIR / "celerybeat-schedule")], env))
            self.say(f"Lockstep is up: {url}/  (login {user} / {password})")
            self.say(f"ingest token for project 'demo': {token}")
            if not no_demo:
                self.run_demo(env, url, token, ranks)
            self.say("stack running; press Ctrl-C to stop")
            while all(service.poll() is None for service in self.services):
                time.sleep(1)
            self.say("a stack process exited; stopping")
        except KeyboardInterrupt:
            self.say("stopping")
        finally:
            self.stop_children()
            self.stop_embedded()

    def say(self, text: str) -> None:
        self.stdout.write(f"[lockstep] {text}")
        self.stdout.flush()

    def demo_login(self) -> tuple[str, str, str]:
        project, _ = Project.objects.get_or_create(name="demo")
        user = User.objects.filter(username="demo").first()
        password = "lockstep-demo"
        if user is None:
            user = User.objects.create_user("demo", password=password, is_staff=True, is_superuser=True)
        project.members.add(user)
        return user.username, password, ProjectToken.issue(project)

    def start(self, name: str, args: list[str], env: dict) -> subprocess.Popen:
        log = open(settings.DATA_DIR / f"{name}.log", "ab")
        child = subprocess.Popen(args, cwd=settings.BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.children.append(child)
        self.say(f"{name} started (pid {child.pid}, log {log.name})")
        return child

    def run_demo(self, env: dict, url: str, token: str, ranks: int) -> None:
        for name, job_args in DEMO_JOBS.items():
            key = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
            job_env = dict(env, LOCKSTEP_URL=url, LOCKSTEP_TOKEN=token, LOCKSTEP_RUN=key, LOCKSTEP_RUN_NAME=name,
                           LOCKSTEP_SPOOL_DIR=str(settings.DATA_DIR / "spool"), OMP_NUM_THREADS="1")
            args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port",
                    str(29500 + os.getpid() % 1000), "-m", "agents", "run", "demo/ddp_job.py", *job_args]
            self.start(f"demo-{name}", args, job_env)
            self.say(f"demo job started: {url}/runs/{key}/ (rank 1 recompiles alone at step 5, "
                     "rank 2's gradient is nudged at step 12; alerts appear within a minute)")

    def stop_children(self) -> None:
        for child in self.children:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGTERM)
        for child in self.children:
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        self.say("stopped")

    def stop_embedded(self) -> None:
        """Embedded servers were started for this stack: stop them too (their data stays)."""
        if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
            return
        from dashboard import embedded

        embedded.stop(settings.DATA_DIR)
        self.say(f"embedded PostgreSQL and Redis stopped; data kept in {settings.DATA_DIR}")
