"""Indexing under ``torchrun``: every rank embeds a shard of the gallery, rank 0 builds and saves the one index.

``torchrun --nproc_per_node=N -m rankopt index ...``: :func:`start` joins torchrun's process group (gloo when the
embeddings are made on the CPU, NCCL on GPUs, each rank on ``cuda:LOCAL_RANK``); :func:`build` has rank ``r`` of
``W`` embed the contiguous shard ``np.array_split(range(N), W)[r]`` of the gallery
(:func:`rankopt.engine.embed_and_score.embed_dataset`), the shards all-gathered in rank order: the items' order, ids,
paths, labels and metadata are those of one process (they come from the dataset, the same on every rank), the
embeddings equal to float tolerance. Rank 0 alone builds the index (DBA, faiss, Qdrant) and saves it.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from rankopt.engine.distributed import DistInfo, init_distributed
from rankopt.postprocess import PostProcessing
from rankopt.search.embedder import Embedder, ImageSource, as_dataset
from rankopt.search.index import Index


def start(device: str, *, cpu_gather: bool = False) -> tuple[DistInfo, str]:
    """``(info, device)``: this process's place in torchrun's group (one process: ``DistInfo()``, ``device`` as
    given) and its embedding device (``"auto"``/``"cuda"`` -> ``cuda:LOCAL_RANK`` on GPUs). ``cpu_gather``: the
    embeddings stay on the CPU whatever ``device`` says (an ONNX model), so the group is gloo."""
    if int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        return DistInfo(), device
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if not on_cpu and device not in ("auto", "cuda"):
        raise ValueError(f"--device {device}: under torchrun each rank embeds on cuda:LOCAL_RANK; pass --device auto, "
                         "cuda or cpu")
    info = init_distributed("gloo" if on_cpu or cpu_gather else "nccl")
    return info, device if on_cpu else f"cuda:{info.local_rank}"


def build(embedder: Embedder, source: ImageSource, *, postprocessing: PostProcessing | None = None,
          **options: Any) -> Index | None:
    """:meth:`Index.build` with the embedding sharded over the ranks (see the module docstring): the index on
    rank 0, ``None`` on the others (they only embed their shard). ``options``: :meth:`Index.build`'s."""
    sharded = torch.distributed.is_available() and torch.distributed.is_initialized()
    if not sharded or torch.distributed.get_rank() == 0:
        return Index.build(embedder, source, postprocessing=postprocessing, **options)
    embedder = embedder.with_postprocessing(postprocessing)
    embedder.embed(as_dataset(source, embedder.transform, class_tree=True))  # this rank's shard, then the gather
    return None


def finish(info: DistInfo) -> None:
    """Leave the process group (no barrier: after the gather no rank waits for another, and rank 0's build may
    outlast a collective's timeout)."""
    if info.distributed:
        torch.distributed.destroy_process_group()
