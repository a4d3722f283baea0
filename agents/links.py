"""Links both ways between a Lockstep run and the same process's W&B and MLflow runs.

Found from what the process already has: the library's active run when the training code imported
it (looked up in `sys.modules`: the agent never imports wandb or mlflow, which would cost seconds
and start their machinery in every rank), else the environment those tools and their launchers
set (WANDB_RUN_ID / WANDB_PROJECT / WANDB_ENTITY, MLFLOW_RUN_ID / MLFLOW_TRACKING_URI /
MLFLOW_EXPERIMENT_ID). The links go to the server in `RankStart.links` (name -> URL, or for a W&B
run that has no URL yet the reason, which the run page shows as text); into each
active run the agent writes the Lockstep run's page URL once (W&B config `lockstep_url`, MLflow
tag `lockstep.url`). Everything here is best-effort and never raises.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

WANDB = "wandb"
MLFLOW = "mlflow"
WANDB_CONFIG_KEY = "lockstep_url"
MLFLOW_TAG = "lockstep.url"
WANDB_APP_URL = "https://wandb.ai"
URL_MAX_CHARS = 2048

log = logging.getLogger("lockstep.agent")


class Links:
    """One per agent: `exchange()` finds the runs and tells each active one the Lockstep URL (once per run)."""

    def __init__(self, lockstep_url: str | None) -> None:
        self.lockstep_url = lockstep_url
        self._told: set[tuple[str, str]] = set()

    def exchange(self) -> dict[str, str]:
        """name -> URL of the W&B and MLflow runs of this process (those it can name)."""
        found: dict[str, str] = {}
        for name, active, from_env in ((WANDB, self._wandb, wandb_from_env), (MLFLOW, self._mlflow, mlflow_from_env)):
            try:
                url = active() or from_env(os.environ)
            except Exception:
                url = None
            if url:
                found[name] = url[:URL_MAX_CHARS]
        return found

    def _wandb(self) -> str | None:
        """The active W&B run's URL (told the Lockstep URL in its config), when wandb is imported."""
        wandb = sys.modules.get("wandb")
        run = getattr(wandb, "run", None) if wandb is not None else None
        if run is None:
            return None
        if self.lockstep_url and (WANDB, run.id) not in self._told:
            run.config.update({WANDB_CONFIG_KEY: self.lockstep_url}, allow_val_change=True)
            self._told.add((WANDB, run.id))
        said = getattr(getattr(run, "settings", None), "run_url", "")  # wandb's own URL for it (its app host)
        return said or wandb_url(WANDB_APP_URL, run.entity, run.project, run.id) or self._wandb_why_not(run)

    def _wandb_why_not(self, run: Any) -> str:
        """What the run page shows instead of a link when the run has no URL yet: an offline run
        without an entity gets one only when `wandb sync` uploads it (under the account's default
        entity, which an offline process cannot know). Logged once, at debug."""
        folder = getattr(getattr(run, "settings", None), "sync_dir", "") or ""
        sync = f"wandb sync {folder}" if folder else "wandb sync"
        why = (
            f"offline run {run.id} (project {run.project}) has no URL until `{sync}`; "
            "set WANDB_ENTITY or wandb.init(entity=...) to link it now"
        )
        if (WANDB, f"why:{run.id}") not in self._told:
            log.debug("W&B run %s not linked: %s", run.id, why)
            self._told.add((WANDB, f"why:{run.id}"))
        return why

    def _mlflow(self) -> str | None:
        """The active MLflow run's URL (tagged with the Lockstep URL), when mlflow is imported."""
        mlflow = sys.modules.get("mlflow")
        run = mlflow.active_run() if mlflow is not None and hasattr(mlflow, "active_run") else None
        if mlflow is None or run is None:
            return None
        run_id = run.info.run_id
        if self.lockstep_url and (MLFLOW, run_id) not in self._told:
            mlflow.MlflowClient().set_tag(run_id, MLFLOW_TAG, self.lockstep_url)
            self._told.add((MLFLOW, run_id))
        return mlflow_url(mlflow.get_tracking_uri(), run.info.experiment_id, run_id)


def wandb_url(app_url: str, entity: str | None, project: str | None, run_id: str | None) -> str | None:
    if not (entity and project and run_id):
        return None
    return f"{app_url.rstrip('/')}/{quote(entity)}/{quote(project)}/runs/{quote(run_id)}"


def wandb_app_url(env: Mapping[str, str]) -> str:
    """The W&B UI for WANDB_APP_URL, else WANDB_BASE_URL (the API: api.host -> host), else wandb.ai."""
    if env.get("WANDB_APP_URL"):
        return env["WANDB_APP_URL"]
    base = env.get("WANDB_BASE_URL", "")
    return base.replace("://api.", "://", 1) if base else WANDB_APP_URL


def wandb_from_env(env: Mapping[str, str]) -> str | None:
    return wandb_url(wandb_app_url(env), env.get("WANDB_ENTITY"), env.get("WANDB_PROJECT"), env.get("WANDB_RUN_ID"))


def mlflow_url(tracking_uri: str | None, experiment_id: str | None, run_id: str | None) -> str | None:
    """The run in MLflow's UI for a tracking server (http/https), or the run's folder of a file store;
    None for other stores (a database URI names no page)."""
    if not (tracking_uri and experiment_id and run_id):
        return None
    uri = tracking_uri.rstrip("/")
    if uri.startswith(("http://", "https://")):
        return f"{uri}/#/experiments/{quote(experiment_id)}/runs/{quote(run_id)}"
    if uri.startswith("file:"):
        return f"{uri}/{quote(experiment_id)}/{quote(run_id)}"
    return None


def mlflow_from_env(env: Mapping[str, str]) -> str | None:
    return mlflow_url(env.get("MLFLOW_TRACKING_URI"), env.get("MLFLOW_EXPERIMENT_ID"), env.get("MLFLOW_RUN_ID"))


def lockstep_run_url(page_url: str | None, run_key: str) -> str | None:
    """The run's page on the Lockstep server people open (run keys are URL-safe: config._sanitize)."""
    return f"{page_url.rstrip('/')}/runs/{run_key}/" if page_url else None
