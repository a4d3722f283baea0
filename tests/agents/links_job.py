"""A single-process training loop that uses W&B (offline) and MLflow (a file: store) the way a user's
script does, started under the agent (`python -m agents run tests/agents/links_job.py OUT`): the
agent attaches before the script has a W&B or MLflow run, and learns of both at the first
optimizer step. Writes what the libraries hold afterwards to OUT (JSON)."""

from __future__ import annotations

import json
import sys

import mlflow
import torch
import wandb


def main(out: str) -> None:
    run = wandb.init(project="lockstep-links", entity="lockstep-tests", config={"lr": 0.1})
    with mlflow.start_run() as ml:
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            x = torch.randn(32, 8)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            wandb.log({"loss": loss.item()}, step=step)
            mlflow.log_metric("loss", loss.item(), step=step)
        facts = {
            "wandb_id": run.id,
            "wandb_url": run.settings.run_url,
            "wandb_config": dict(run.config),
            "wandb_dir": run.dir,
            "mlflow_id": ml.info.run_id,
            "mlflow_experiment": ml.info.experiment_id,
        }
    wandb.finish()
    with open(out, "w") as f:
        json.dump(facts, f)


if __name__ == "__main__":
    main(sys.argv[1])
