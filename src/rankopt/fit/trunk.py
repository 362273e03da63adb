"""The trunk's outputs of every photo, computed once: what makes fine-tuning fit a CPU's minutes.

The network is cut before the stage that first reaches its final resolution
(:func:`final_resolution_cut`): the trunk (the early stages, most of the forward's cost) stays
fixed, the tail (the last-resolution stages, the pooling and the head) is fine-tuned. Each photo goes
through the trunk once (and each training photo once more mirrored, the augmentation a cached trunk
allows); every training step, validation and the final index then run only the tail.
``tail(trunk(x)) == net(x)`` exactly (:mod:`rankopt.models.stages`), so the index built from the cache
holds the embeddings the served model gives the same photos.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rankopt.data.base import RetrievalDataset
from rankopt.engine.embed_and_score import embed_dataset
from rankopt.export.runtimes import TIMED_BATCH, Runtime, default_runtime, prepare_network
from rankopt.models.fingerprint import model_fingerprint
from rankopt.models.retrieval_net import RetrievalNet
from rankopt.models.stages import backbone_stages


def final_resolution_cut(net: RetrievalNet, image_size: tuple[int, int]) -> int:
    """The index of the first stage whose output has the last stage's spatial size (the tail starts there)."""
    stages = backbone_stages(net)
    x = torch.zeros(1, 3, *image_size)
    sizes = []
    with torch.no_grad():
        for stage in stages:
            x = stage(x)
            sizes.append(tuple(x.shape[2:]))
    final = next((s for s in reversed(sizes) if len(s) == 2), None)
    first = next(i for i, s in enumerate(sizes) if s == final)
    return max(1, min(first, len(stages) - 1))


@dataclass
class TrunkCache:
    """Trunk outputs, flattened: ``center[i]`` of photo ``i``, ``mirrored[j]`` of photo ``rows[j]`` flipped
    left-right (None when not computed); ``shape`` is one output's ``(C, H, W)``."""

    center: torch.Tensor
    shape: tuple[int, ...]
    mirrored: torch.Tensor | None = None
    rows: np.ndarray | None = None

    def outputs(self, index: np.ndarray, mirror: np.ndarray | None = None) -> torch.Tensor:
        """``(B, C, H, W)`` outputs of photos ``index``; where ``mirror`` is set, their mirrored copy (photos
        without one, outside ``rows``, stay centred)."""
        out = self.center[torch.as_tensor(index)].clone()
        if mirror is not None and self.mirrored is not None:
            mirror = mirror & np.isin(index, self.rows)
        if mirror is not None and self.mirrored is not None and mirror.any():
            slot = np.searchsorted(self.rows, index[mirror])
            out[torch.as_tensor(np.flatnonzero(mirror))] = self.mirrored[torch.as_tensor(slot)]
        return out.view(-1, *self.shape)

    def nbytes(self) -> int:
        return self.center.numel() * 4 + (0 if self.mirrored is None else self.mirrored.numel() * 4)


def frozen_forwards(net: nn.Module, trunk: nn.Module, preprocessing: dict[str, Any], runtime: str | None,
                    device: torch.device, say: Callable[[str], None], batch: int = TIMED_BATCH
                    ) -> tuple[nn.Module, nn.Module, Runtime]:
    """The pretrained ``net`` and its :func:`flat_trunk` on ``runtime`` (:func:`rankopt.export.runtimes.
    prepare_network`, at batches of ``batch``; ``None``: the default), and the trunk's runtime: both networks are
    frozen while they run (framing, the trunk pass), and their exports are cached by fingerprint, so every fit
    from the same weights reuses them."""
    runtime = runtime or default_runtime()
    fast_net, _ = prepare_network(net, preprocessing, model_fingerprint(net, preprocessing), runtime=runtime,
                                  device=device, say=say, batch=batch)
    flat = flat_trunk(trunk)
    fast_trunk, chosen = prepare_network(flat, preprocessing, model_fingerprint(flat, preprocessing),
                                         runtime=runtime, device=device, say=say, batch=batch)
    return fast_net, fast_trunk, chosen


def flat_trunk(trunk: nn.Module) -> nn.Module:
    """``trunk`` with its outputs flattened, ``(B, 3, H, W) -> (B, C·H·W)``: the network of the trunk pass."""
    return nn.Sequential(trunk, nn.Flatten(1))


def trunk_outputs(trunk: nn.Module, dataset: RetrievalDataset, *, device: torch.device, batch_size: int,
                  workers: int = 0, mirror: bool = False, desc: str = "trunk", network: nn.Module | None = None,
                  read_threads: int = 0, out: Path | None = None) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``(N, C·H·W)`` float32 trunk outputs of ``dataset``'s photos (mirrored left-right when ``mirror``), computed
    by ``network`` (default :func:`flat_trunk`; e.g. its onnxruntime session, :mod:`rankopt.export.runtimes`) with
    ``read_threads`` reading ahead; ``out``: written to that ``.npy`` file and returned as its memory map."""
    flat = network if network is not None else flat_trunk(trunk)
    flip: Callable[[torch.Tensor], torch.Tensor] | None = (lambda x: x.flip(-1)) if mirror else None
    split = embed_dataset(flat, dataset, batch_size=batch_size, device=device, num_workers=workers,
                          batch_transform=flip, desc=desc, read_threads=read_threads if workers == 0 else 0,
                          out=out)
    with torch.no_grad():
        probe = dataset[0]["image"].unsqueeze(0).to(device)
        shape = tuple(trunk.eval()(probe).shape[1:])
    return split.embeddings, shape


def embed_cached(tail: nn.Module, cache: TrunkCache, rows: np.ndarray, *, batch_size: int = 256) -> torch.Tensor:
    """``(len(rows), D)`` embeddings of the cached photos ``rows`` through ``tail`` (eval mode, restored after)."""
    was = tail.training
    tail.eval()
    device = next(tail.parameters()).device
    out = []
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            out.append(tail(cache.outputs(rows[start:start + batch_size]).to(device)).float().cpu())
    tail.train(was)
    return torch.cat(out) if out else torch.empty(0, 0)


class TailStates:
    """The trainable tail and its named states (``pretrained``; the tuned states; ``refit``): one place that loads a
    state into the tail, and so into the whole network, and embeds cached photos with it."""

    PRETRAINED = "pretrained"

    def __init__(self, tail: nn.Module, cache: TrunkCache) -> None:
        self.tail, self.cache = tail, cache
        self.states: dict[str, dict[str, torch.Tensor]] = {self.PRETRAINED: trainable_state(tail)}

    def add(self, name: str, state: dict[str, torch.Tensor]) -> None:
        self.states[name] = state

    def load(self, name: str) -> None:
        """Put state ``name`` into the tail (the network embeds with it from now on)."""
        load_trainable(self.tail, self.states[name])

    def embed(self, name: str, rows: np.ndarray) -> torch.Tensor:
        """``(len(rows), D)`` embeddings of the cached photos ``rows`` with state ``name`` (left loaded)."""
        self.load(name)
        return embed_cached(self.tail, self.cache, rows)


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of ``model``'s trainable parameters."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` (from :func:`trainable_state`) into ``model``'s parameters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in state:
                p.copy_(state[name])
