"""Settings that fit PyTorch to the machine: glibc's allocator thresholds, CPU forward chunks, ``auto`` values.

glibc serves allocations above ``M_MMAP_THRESHOLD`` (at most 32 MiB by its dynamic rule) with fresh
``mmap`` pages and returns freed heap tops above ``M_TRIM_THRESHOLD`` to the kernel. A CNN's activations
(e.g. MobileNetV2, 64 images at 128 px: 33 MB per feature map) are allocated and freed every layer, so
every forward pass faults in and zeroes new pages, most of its time in the kernel.
:func:`keep_allocations` raises both thresholds to 1 GiB, so freed memory is reused in the process, and
makes every thread allocate from the main arena (``M_ARENA_MAX`` 1): a thread's own arena grows in heaps
of at most 64 MiB, so a larger activation there is a fresh ``mmap`` again, as on ``rankopt serve``'s worker
thread (measured: benchmarks/results/models_engine.md). The cost: up to 1 GiB of freed memory stays mapped to
the process instead of going back to the system, and threads allocating at once share one lock.
The command line calls it at start; library users may call it themselves. ``RANKOPT_MALLOC=system``
leaves glibc's defaults.

Kept memory only helps while a forward's activations fit in it (a batch of 256 at 224 px holds 1.2 GB feature
maps), so a forward on CPU runs in chunks of :func:`forward_chunk` images, whose largest activation stays under
``KEEP_BYTES / CHUNK_SHARE`` (several maps are alive at once, and freed memory above the trim threshold goes
back to the system); the largest activation per image is measured by :func:`activation_bytes` (measured: kernel
time with and without the chunks, benchmarks/results/loader.md).

:func:`resolve_auto` turns a config's ``auto`` values (``data.num_workers``, ``train.sub_batch_size``) into
numbers that fit the machine, in one place (the trainer calls it and saves the resolved config).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where used: the command line calls keep_allocations before importing it
    import torch

    from rankopt.config import ExperimentConfig

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
KEEP_BYTES = 1 << 30
CHUNK_SHARE = 8  # a CPU forward chunk's largest activation: at most KEEP_BYTES / CHUNK_SHARE (128 MiB)
RAM_SHARE = 4  # a CPU training batch's saved activations: at most a quarter of the machine's memory
DEVICE_SHARE = 2  # on an accelerator: at most half of its free memory
AUTO = "auto"


def keep_allocations(threshold: int = KEEP_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds to ``threshold`` bytes and keep to one arena; True when applied
    (Linux with glibc, and ``RANKOPT_MALLOC`` is not ``system``). Call it before starting threads."""
    if not sys.platform.startswith("linux") or os.environ.get("RANKOPT_MALLOC", "").lower() == "system":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    value = min(int(threshold), 2**31 - 1)
    return all(bool(mallopt(option, setting)) for option, setting in
               ((M_MMAP_THRESHOLD, value), (M_TRIM_THRESHOLD, value), (M_ARENA_MAX, 1)))


def pause_collection() -> None:
    """Turn Python's cyclic garbage collector off while a command starts: its imports (torch, onnxruntime and
    rankopt: 200,000 tracked objects) are never garbage, yet each full collection walks them all (five during
    ``rankopt index``'s start, 0.44 s, and one more after its pass, 0.21 s; with it off, 0.30 s in all, timed with
    ``gc.callbacks``: docs/performance.md). :func:`settle_heap` collects once and turns it back on."""
    gc.disable()


def freeze_imports() -> None:
    """Once a command has imported what its pass needs, with collection paused (:func:`pause_collection`): every
    object alive then is put out of the collector's reach (``gc.freeze``). Imported modules, their functions and
    classes (torch's: about 200,000 objects) are never garbage, so :func:`settle_heap`'s one collection walks only
    what the command made since: 0.004 against 0.13 s in ``rankopt index`` (the ~800 objects imports leave in
    cycles stay). Objects still die when their last reference goes. A no-op when the collector is on."""
    if not gc.isenabled():
        gc.freeze()


def settle_heap() -> None:
    """Where a long pass starts (an embedding pass, training, the service): if :func:`pause_collection` turned the
    collector off, the garbage the start left in cycles is collected once (an ONNX export's graphs, decoding's
    exceptions: never kept for good), every object alive then is put out of the collector's reach (``gc.freeze``:
    they live as long as the process) and collection turns back on, so later collections walk only the pass's own
    objects. A no-op when the collector is on (a library caller, the tests)."""
    if not gc.isenabled():
        gc.collect()
        gc.freeze()
        gc.enable()


def activation_bytes(model: torch.nn.Module, sample: torch.Tensor) -> tuple[int, int]:
    """``(saved, largest)``: the bytes per image that ``model``'s autograd graph saves for the backward pass, and
    the bytes per image of the largest of those tensors, measured by one forward of ``sample`` (a batch) with a
    graph, in eval mode (no BatchNorm statistics move; the mode is restored), parameters and buffers left out."""
    import itertools

    import torch

    params = {p.untyped_storage().data_ptr() for p in itertools.chain(model.parameters(), model.buffers())}
    storages: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            model(sample.detach().clone().requires_grad_(True))  # a slice of a batch: its own storage
    finally:
        model.train(was_training)
    count = max(int(sample.shape[0]), 1)
    return sum(storages.values()) // count, max(storages.values(), default=0) // count


def forward_chunk(model: torch.nn.Module, images: torch.Tensor) -> int:
    """How many of ``images`` (a ``(B, C, H, W)`` batch) one forward of ``model`` takes: on CPU, ``B`` split into
    the fewest even chunks whose largest activation fits ``KEEP_BYTES / CHUNK_SHARE`` (measured on the first
    image, :func:`activation_bytes`); elsewhere ``B`` (device memory bounds the batch, not glibc)."""
    batch = int(images.shape[0])
    if images.device.type != "cpu" or batch <= 1:
        return max(batch, 1)
    _, largest = activation_bytes(model, images[:1])
    return even_chunk(batch, KEEP_BYTES // CHUNK_SHARE // max(largest, 1))


def even_chunk(batch: int, fit: int) -> int:
    """The size of the fewest even chunks of ``batch`` items holding at most ``fit`` (>= 1) each."""
    return -(-batch // -(-batch // max(fit, 1)))  # ceil(B / chunks), chunks = ceil(B / fit)


def memory_bytes(device: torch.device) -> int:
    """The memory a training batch's activations may take on ``device``: a quarter of the machine's RAM on CPU,
    half of an accelerator's free memory (``RAM_SHARE``, ``DEVICE_SHARE``)."""
    if device.type == "cuda":
        import torch

        return torch.cuda.mem_get_info(device)[0] // DEVICE_SHARE
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // RAM_SHARE


def sub_batch_size(saved: int, largest: int, batch_size: int, device: torch.device) -> int | None:
    """The training sub-batch (multistaged backpropagation) for batches of ``batch_size`` images saving ``saved``
    bytes each, the largest activation ``largest`` bytes each (:func:`activation_bytes`) on ``device``, or
    ``None`` when a whole batch fits: its saved activations within :func:`memory_bytes` and, on CPU, its largest
    activation within ``KEEP_BYTES / CHUNK_SHARE``; the sub-batches are even (:func:`even_chunk`)."""
    fits = memory_bytes(device) // max(saved, 1)
    if device.type == "cpu":
        fits = min(fits, KEEP_BYTES // CHUNK_SHARE // max(largest, 1))
    return None if fits >= batch_size else even_chunk(batch_size, int(fits))


def cpu_count() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def workers(device: torch.device) -> int:
    """DataLoader workers for training on ``device``: none on CPU (a worker takes a core from the model; measured
    in benchmarks/results/loader.md), else up to 4 of the cores beside the main process."""
    return 0 if device.type == "cpu" else max(0, min(4, cpu_count() - 1))


def resolve_auto(cfg: ExperimentConfig, model: torch.nn.Module, device: torch.device,
                 sample: Callable[[], torch.Tensor]) -> str:
    """Resolve ``cfg``'s ``auto`` values in place for ``model`` on ``device``: ``data.num_workers``
    (:func:`workers`), ``train.sub_batch_size`` (:func:`sub_batch_size` of the activations measured on ``sample()``,
    a batch of training images at the training size; ``None`` when a batch fits). Returns a line saying what was
    resolved, torch's threads included (``""`` when nothing was ``auto``)."""
    parts = []
    if cfg.data.num_workers == AUTO:
        cfg.data.num_workers = workers(device)
        parts.append(f"data.num_workers={cfg.data.num_workers}")
    if cfg.train.sub_batch_size == AUTO:
        images = sample()
        saved, largest = activation_bytes(model, images)
        cfg.train.sub_batch_size = sub_batch_size(saved, largest, cfg.train.batch_size, device)
        shown = "null (whole batches fit)" if cfg.train.sub_batch_size is None else cfg.train.sub_batch_size
        parts.append(f"train.sub_batch_size={shown} (batch {cfg.train.batch_size}, {saved / 2**20:.1f} MiB of "
                     f"activations per image at {tuple(images.shape[1:])}, largest {largest / 2**20:.1f} MiB; "
                     f"budget {memory_bytes(device) / 2**30:.1f} GiB)")
        if cfg.train.sub_batch_size is not None and not cfg.model.freeze_bn:
            parts.append("note: with model.freeze_bn=false BatchNorm normalises each sub-batch by its own statistics")
    if not parts:
        return ""
    import torch

    return (f"auto settings for {device.type} ({cpu_count()} cores, torch threads {torch.get_num_threads()}): "
            + ", ".join(parts))
