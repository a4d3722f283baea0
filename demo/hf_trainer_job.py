"""A Hugging Face Trainer job as teams write it, with `TrainingArguments(torch_compile=True)` (run it
under torchrun with the agent: `torchrun --nproc-per-node 3 -m agents run demo/hf_trainer_job.py`).

A tiny GPT-2 built from a `GPT2Config` (random weights, nothing downloaded) learns random tokens on
the CPU over gloo. The Trainer hands the model to Accelerate, which wraps it in
DistributedDataParallel and then compiles the wrapper: torch.compile(DDP(model)). Faults, on
`--fault-rank` alone: `--fault lr` (its TrainingArguments name ten times the learning rate: the
gradients, averaged by DDP, still agree; its weights drift from the first update on) and
`--fault shape` (its batch at `--fault-step` has a row more: it alone recompiles).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

import torch
from torch.utils.data import Dataset

from demo.ddp_job import end_distributed
from demo.trainer_parts import fault_of, job_parser

SEQ, VOCAB = 16, 64


def parse_args() -> argparse.Namespace:
    p = job_parser(__doc__, batch=4)
    p.add_argument("--lr", type=float, default=1e-3)
    return p.parse_args()


class RandomTokens(Dataset[dict[str, torch.Tensor]]):
    """`n` sequences of random tokens, the same on every rank (the Trainer's sampler shards them)."""

    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2() -> Any:
    """transformers' own GPT-2 modeling code, one small layer, random weights (no hub access)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def main() -> None:
    args = parse_args()
    from transformers import Trainer, TrainingArguments

    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    lr, collate = fault_of(args, rank, 1e-3)
    with tempfile.TemporaryDirectory(prefix="hf-trainer-") as out:
        training = TrainingArguments(
            output_dir=out,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch,
            learning_rate=lr,
            torch_compile=True,  # the Trainer's own switch: Accelerate compiles the DDP-wrapped model
            torch_compile_backend=args.backend,
            use_cpu=True,
            ddp_backend="gloo",
            dataloader_drop_last=True,
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            seed=0,
        )
        trainer = Trainer(
            model=tiny_gpt2(),
            args=training,
            train_dataset=RandomTokens(args.steps * args.batch * world),
            data_collator=collate,
        )
        trainer.train()
    # Trainer.end() (Accelerate's end_training) destroys the group without the barrier gloo needs here
    end_distributed()


if __name__ == "__main__":
    main()
