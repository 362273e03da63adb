"""The trainer under torchrun-style DDP: 2 gloo processes on CPU, tiny SYNTHETIC data.

Checks the wiring (DDP model, DistributedLoss, sharded sampler, memory, proxy optimizer,
gathered evaluation, main-process-only files): after training, both ranks hold identical
model, proxy and memory states, and only rank 0 wrote the run folder."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

WORLD = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from test_trainer import TinySynthetic, tiny_config

    from rankopt.engine import trainer as trainer_mod

    trainer_mod.build_datasets = lambda cfg, *, train=True: (
        TinySynthetic(16, 6, 0, "train") if train else None, {"test": TinySynthetic(8, 4, 1, "test")})
    cfg = tiny_config(Path(out) / "run", "train.epochs=1", "train.max_steps_per_epoch=2", "train.device=cpu",
                      "loss.name=rod_ap", "train.memory.enabled=true", "train.memory.size=24")
    trainer = trainer_mod.Trainer(cfg)
    trainer.fit()
    state = {"model": trainer.model.state_dict(), "loss": trainer.loss_fn.state_dict(),
             "memory": trainer.memory.state_dict()}
    torch.save(state, Path(out) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_ddp_ranks_stay_identical(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    states = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    for part in ("model", "loss", "memory"):
        for key, value in states[0][part].items():
            assert torch.equal(value, states[1][part][key]), f"{part}.{key} differs between ranks"
    assert int(states[0]["memory"]["filled"]) == 24  # the memory holds the gathered global batches
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "run" / "report.json").is_file()
