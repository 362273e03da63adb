"""Embed datasets with a model and score them with ``rankopt.metrics.evaluate``.

Under ``torch.distributed`` every rank embeds a contiguous shard of the dataset
and the shards are gathered (``rankopt.engine.distributed.gather_for_evaluation``)
so every item is scored exactly once, in dataset order, with no padding.
One split is self-retrieval (each query excluded from its own results by index);
two splits are ``(query, gallery)``; when the gallery contains the queries
(``dataset.metadata["gallery_contains_queries"]``: DyML), each query's copy in the gallery
(matched by path or file name, see :func:`query_ref_index`) is excluded from its results by
index. A query split carrying revisitop ground truth (``dataset.metadata["ground_truth"]``:
Revisited Oxford/Paris) is scored with the Easy/Medium/Hard protocol of
``rankopt.metrics.landmarks`` (keys ``medium/map``, ...).

open-metric-learning's per-item columns (the ``csv`` dataset): ``metadata["sequence"]`` (a string per
item, ``""``: none) makes each query ignore the references of its sequence, by index, as it ignores
itself (exclusion groups of :func:`rankopt.metrics.evaluate`, numbered jointly over the query and gallery
splits); ``metadata["category"]`` on the query split adds every metric per query category
(``EvaluationResult.by_category``; each query still retrieves from the whole gallery, as in OML).

Face protocol (IJB-C, Smooth-AP §5.1 and §6.3): a self-retrieval split whose metadata has
``media`` (``(N,)`` the media id of each item; a video's frames share one) is scored on media
instances, each the mean of its items' embeddings (``rankopt.metrics.verification.group_mean``,
after whitening, before DBA/αQE), every instance a query over all the others; a media's items must
share their labels. The means are not normalised here: cosine scoring normalises them
(``rankopt.similarity.prepare``). With ``templates`` (``(M, 2)`` rows ``(template_id, item_index)``)
and ``template_pairs`` (``(P, 3)`` rows ``(template1, template2, label)``) too, the 1:1 verification
TARs (``tar@far=1e-06`` ... ``tar@far=1e-01``, ``rankopt.metrics.verification.verification_metrics``
on the whitened item embeddings) join the retrieval metrics. Without templates, ``tar@far=F`` names in the
metrics verify every pair of a self-retrieval split (genuine: same finest label;
``rankopt.metrics.verification.all_pairs_tar_at_far``), e.g. Yale B's test identities.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from rankopt.checks import check_labels
from rankopt.config import EvalConfig
from rankopt.console import bars_shown
from rankopt.data.fast_transform import collate
from rankopt.data.readable import ReadableCollate, SkipUnreadable
from rankopt.data.reader import CPU_BATCH, read_ahead
from rankopt.engine.distributed import gather_for_evaluation
from rankopt.console import progress
from rankopt.engine.relevance_batches import check_evaluation, check_splits, split_relevance, uses_multilabels
from rankopt.files import open_npy_atomic
from rankopt.metrics import EvaluationResult, check_metrics, evaluate
from rankopt.metrics.landmarks import revisited_map
from rankopt.metrics.verification import all_pairs_tar_at_far, group_mean, parse_far_keys, verification_metrics
from rankopt.postprocess import PostProcessing
from rankopt.runtime import forward_chunk, settle_heap
from rankopt.similarity import pairwise

SEQUENCE, CATEGORY = "sequence", "category"  # per-item metadata keys: exclusion groups, query categories


@dataclass
class EmbeddedSplit:
    """Embeddings ``(N, D)`` float32 on CPU, labels ``(N, L)`` int64, image paths and metadata of one split."""

    embeddings: torch.Tensor
    labels: torch.Tensor
    paths: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)


def autocast_context(device: torch.device, amp: str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for ``amp`` in {"bf16", "fp16"}; a no-op for ``"none"``."""
    if amp == "none":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    return torch.autocast(device_type=device.type, dtype=dtype)


def _distributed() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


@torch.no_grad()
def embed_dataset(model: torch.nn.Module, dataset: Dataset, *, batch_size: int = 256,
                  device: torch.device | str = "cpu", num_workers: int = 0, amp: str = "none",
                  show_progress: bool = True, desc: str = "embedding",
                  batch_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  embedding_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  out: str | os.PathLike[str] | None = None, read_threads: int = 0,
                  unreadable: dict[int, str] | None = None) -> EmbeddedSplit:
    """Embed every item of ``dataset`` (``model`` in eval mode, restored afterwards).

    ``batch_transform``: applied to each ``(B, 3, H, W)`` batch on ``device`` (datasets built without a transform).
    ``embedding_transform``: applied to each batch's ``(B, D)`` embeddings before they are stored (row-wise,
    e.g. a whitening). The output ``(N, D)`` is allocated once the first batch gives ``D`` and filled in
    place, so memory holds one batch of images and the embeddings once. On CPU each batch goes through
    ``model`` in chunks of :func:`rankopt.runtime.forward_chunk` images (sized on the first batch), so its
    activations stay in the memory the process keeps; the embeddings are those of whole batches (per-image
    model in eval mode). ``out``: the embeddings are written
    straight into that ``.npy`` file (memory-mapped, moved into place when complete,
    :func:`rankopt.files.open_npy_atomic`) and the returned split's embeddings are that memory map. Under
    ``torch.distributed`` the shards are gathered in memory and rank 0 writes ``out``. ``read_threads`` (without
    ``num_workers``): the next batches are read on that many threads during the forward
    (:func:`rankopt.data.reader.read_ahead`; datasets safe to read from several threads), on CPU in batches of at
    most :data:`rankopt.data.reader.CPU_BATCH`. ``unreadable`` (one
    process, no ``out``): an item whose image cannot be read (:class:`rankopt.data.readable.SkipUnreadable`) is left
    out and ``unreadable[position] = why`` recorded; the split holds the other items' rows, the dataset's metadata
    as it is (:func:`rankopt.data.readable.without_unreadable` makes the dataset of those items).
    """
    settle_heap()
    device = torch.device(device)
    rank, world = _distributed()
    if unreadable is not None and (world > 1 or out is not None):
        raise ValueError("unreadable= needs one process and no out= file (check the images first: "
                         "rankopt.data.readable.readable_images)")
    shard = np.array_split(np.arange(len(dataset)), world)[rank]
    if read_threads > 0 and num_workers == 0 and device.type == "cpu":
        batch_size = min(batch_size, CPU_BATCH)  # the forward's chunks: larger read batches only hold more photos
    loader = _batches(dataset, shard.tolist(), batch_size, num_workers, read_threads, skip=unreadable is not None)
    was_training = model.training
    model.eval()
    local: torch.Tensor | None = None  # (N_local, D), allocated when the first batch gives D
    filled = 0
    chunk = 0  # images per forward, sized on the first batch
    with contextlib.ExitStack() as files:
        def allocate(dim: int) -> torch.Tensor:
            if out is not None and world == 1:
                return torch.from_numpy(files.enter_context(open_npy_atomic(out, (len(shard), dim), np.float32)))
            return torch.empty((len(shard), dim), device=device if world > 1 else "cpu")  # gathered on device

        for batch, bad in progress(loader, desc=desc, enabled=show_progress and rank == 0,
                                   total=-(-len(shard) // batch_size),
                                   count=lambda pair: len(pair[1]) + (len(pair[0]["image"]) if pair[0] else 0)):
            if unreadable is not None:
                unreadable.update(bad)
            if batch is None:  # every item of the batch unreadable
                continue
            images = batch["image"].to(device, non_blocking=True)
            if batch_transform is not None:
                images = batch_transform(images)
            with autocast_context(device, amp):
                chunk = chunk or forward_chunk(model, images)
                embeddings = torch.cat([model(piece).float() for piece in images.split(chunk)])
            if embedding_transform is not None:
                embeddings = embedding_transform(embeddings)
            if local is None:
                local = allocate(embeddings.shape[1])
            local[filled : filled + embeddings.shape[0]] = embeddings
            filled += embeddings.shape[0]
        if local is None:
            local = allocate(getattr(model, "embedding_dim", 0))
    model.train(was_training)
    if world > 1:
        local = gather_for_evaluation(local).cpu()
        if out is not None and rank == 0:
            with open_npy_atomic(out, tuple(local.shape), np.float32) as array:
                array[:] = local.numpy()
    labels = torch.as_tensor(np.asarray(dataset.labels), dtype=torch.long)  # type: ignore[attr-defined]
    metadata = dict(getattr(dataset, "metadata", {}) or {})
    paths = list(dataset.paths)  # type: ignore[attr-defined]
    if unreadable:
        kept = [i for i in range(len(paths)) if i not in unreadable]
        local, labels, paths = local[:filled], labels[kept], [paths[i] for i in kept]
    return EmbeddedSplit(local, labels, paths, metadata)


def _batches(dataset: Dataset, indices: list[int], batch_size: int, num_workers: int, read_threads: int, *,
             skip: bool) -> Iterable[tuple[Any, list[tuple[int, str]]]]:
    """``(batch, [(position, why) of the items left out])`` of ``dataset[indices]`` in order: read ahead on
    ``read_threads`` threads, else by a DataLoader with ``num_workers``; ``skip``: unreadable images are left out
    (:class:`~rankopt.data.readable.SkipUnreadable`; batch ``None`` when none is left), else their error raises."""
    source: Any = SkipUnreadable(dataset) if skip else dataset
    batched = ReadableCollate(collate) if skip else collate
    if read_threads > 0 and num_workers == 0:
        loader: Iterable[Any] = read_ahead(source, indices, batch_size, batched, threads=read_threads)
    else:
        loader = DataLoader(Subset(source, indices), batch_size=batch_size, shuffle=False, num_workers=num_workers,
                            generator=torch.Generator().manual_seed(0), collate_fn=batched)
    return loader if skip else ((batch, []) for batch in loader)


def query_ref_index(query_paths: Sequence[str], gallery_paths: Sequence[str]) -> torch.Tensor:
    """``(Q,)`` int64: for each query path, the index of its copy among ``gallery_paths``, or -1.

    The copy is the gallery item with the same path, else the one with the same file name
    (DyML stores a query as ``bmk_*/query/NAME`` and its copy as ``bmk_*/gallery/NAME``); a file
    name shared by several gallery items (and no exact path match) is ambiguous: ``ValueError``.
    """
    from pathlib import PurePath

    by_path: dict[str, int] = {}
    by_name: dict[str, list[int]] = {}
    for j, path in enumerate(gallery_paths):
        by_path.setdefault(path, j)
        by_name.setdefault(PurePath(path).name, []).append(j)
    index = []
    for path in query_paths:
        if path in by_path:
            index.append(by_path[path])
            continue
        same_name = by_name.get(PurePath(path).name, [])
        if len(same_name) > 1:
            shown = ", ".join(gallery_paths[j] for j in same_name[:3])
            raise ValueError(f"query {path}: its file name matches {len(same_name)} gallery items ({shown}); "
                             "cannot tell which is its copy")
        index.append(same_name[0] if same_name else -1)
    return torch.tensor(index, dtype=torch.long)


def _media_instances(split: EmbeddedSplit, embeddings: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(means (G, D), labels (G, L))``: ``embeddings`` (the split's, possibly whitened) averaged over
    each media of ``split.metadata["media"]``, media in increasing id order; a media whose items
    have different labels raises ``ValueError`` naming it and two of its items."""
    media = torch.as_tensor(np.asarray(split.metadata["media"]))
    means, media_ids = group_mean(embeddings, media)  # checks media: (N,) integer ids
    item_labels = check_labels(split.labels, embeddings.shape[0], "labels")
    group = torch.searchsorted(media_ids, media.long())
    first = torch.full((media_ids.numel(),), group.numel()).scatter_reduce(0, group, torch.arange(group.numel()),
                                                                           "amin")
    labels = item_labels[first]
    mixed = (item_labels != labels[group]).any(dim=1).nonzero().flatten()
    if mixed.numel():
        i = int(mixed[0])
        j = int(first[group[i]])
        raise ValueError(f"metadata['media']: media {int(media[i])} mixes labels: item {j} ({split.paths[j]}) has "
                         f"{item_labels[j].tolist()}, item {i} ({split.paths[i]}) has {item_labels[i].tolist()}; "
                         "a media (a video's frames) shows one subject")
    return means, labels


def sequence_groups(query: EmbeddedSplit, ref: EmbeddedSplit) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(query_groups, ref_groups)`` int64 from ``metadata["sequence"]``, one id per distinct sequence
    over both splits, ``-1`` where empty (or where a split has no sequences); ``None`` when neither has any."""
    if SEQUENCE not in query.metadata and SEQUENCE not in ref.metadata:
        return None
    names = np.concatenate([np.asarray(split.metadata.get(SEQUENCE, [""] * len(split.paths)), dtype=str).reshape(-1)
                            for split in (query, ref)])
    if names.size != len(query.paths) + len(ref.paths):
        raise ValueError(f"metadata['sequence'] must hold one entry per item ({len(query.paths)} queries, "
                         f"{len(ref.paths)} references)")
    codes = np.where(names == "", -1, np.unique(names, return_inverse=True)[1].reshape(-1))
    groups = torch.as_tensor(codes.astype(np.int64))
    return groups[: len(query.paths)], groups[len(query.paths) :]


def query_categories(query: EmbeddedSplit) -> list[str | None] | None:
    """Each query's ``metadata["category"]`` (``None`` where empty), or ``None`` without categories."""
    if CATEGORY not in query.metadata:
        return None
    return [str(c) or None for c in np.asarray(query.metadata[CATEGORY]).reshape(-1)]


def score(splits: Sequence[EmbeddedSplit], cfg: EvalConfig, *, device: torch.device | str | None = None,
          metrics: Sequence[str] | None = None, show_progress: bool = False,
          postprocessing: PostProcessing | None = None, relevance: str = "none") -> Any:
    """``rankopt.metrics.evaluate`` on one split (self-retrieval) or two (query, gallery);
    the revisitop protocol (all its metrics) when the query split has landmark ground truth.
    When the query split's metadata has ``gallery_contains_queries``, each query's copy in the
    gallery (:func:`query_ref_index`) is excluded from its results. With ``sequence`` metadata each query
    also ignores its sequence (:func:`sequence_groups`); with ``category`` metadata on the query split the
    result has ``by_category``. A self-retrieval split with ``media`` metadata is scored on media
    instances, plus the verification TARs when it has ``templates`` and ``template_pairs`` (the face
    protocol, module docstring).

    ``postprocessing`` (``rankopt.postprocess``): whitening, then DBA of the gallery and αQE of
    the queries, applied to the embeddings before scoring. With DBA/αQE a self-retrieval split is
    scored as queries vs the augmented gallery, each query still excluded from its results by index
    and from its own expansion; DBA there is transductive (a gallery item's neighbours may include
    the query), unlike a separate query set.

    ``relevance``: ``none`` (class labels), ``multilabel`` or ``multilabel_graded``: the splits' multi-label items
    (``metadata["multilabels"]``) as the relevance, ``rankopt.engine.relevance_batches.split_relevance`` (query x
    gallery, or a split against itself), scored by ``evaluate(..., relevance=)`` as ``rankopt evaluate-embeddings
    --multilabels`` does; not with media averaging, landmark ground truth or ``tar@far`` metrics."""
    if len(splits) not in (1, 2):
        raise ValueError(f"evaluation needs 1 split (self-retrieval) or 2 (query, gallery), got {len(splits)}")
    query = splits[0]
    ref = splits[1] if len(splits) == 2 else None
    given = None
    if uses_multilabels(relevance):
        check_evaluation(relevance, query.metadata, metrics or cfg.metrics)
        given = split_relevance(query.metadata, None if ref is None else ref.metadata, relevance)
    if ref is not None and any("media" in split.metadata for split in splits):
        raise ValueError("media averaging (metadata['media']) serves self-retrieval only: score one split, not a query "
                         "and a gallery")
    if "media" in query.metadata and (SEQUENCE in query.metadata or CATEGORY in query.metadata):
        raise ValueError("metadata['sequence'] and metadata['category'] are per item; media averaging "
                         "(metadata['media']) scores media instances")
    groups = sequence_groups(query, query if ref is None else ref)
    own = None
    if ref is not None and query.metadata.get("gallery_contains_queries"):
        own = query_ref_index(query.paths, ref.paths)
    post = postprocessing or PostProcessing()
    items = post.whiten(query.embeddings)
    query_emb, query_labels = _media_instances(query, items) if "media" in query.metadata else (items, query.labels)
    query_emb, ref_emb = post.expand(query_emb, None if ref is None else post.whiten(ref.embeddings),
                                     exclude=own, similarity=cfg.similarity, chunk_size=cfg.chunk_size)
    ref_labels = None if ref is None else ref.labels
    if ref is None and ref_emb is not None:  # self-retrieval against the augmented gallery
        own, ref_labels = torch.arange(query_emb.shape[0]), query_labels
    ground_truth = query.metadata.get("ground_truth")
    if ground_truth is not None and ref is not None:
        values = revisited_map(pairwise(query_emb, ref_emb, cfg.similarity), ground_truth)
        without = int(values.get("medium/num_queries_without_positive", 0))
        return EvaluationResult({k: v for k, v in values.items() if "num_queries" not in k}, len(ground_truth), without)
    query_groups, ref_groups = groups if groups is not None else (None, None)
    names, fars = parse_far_keys(list(metrics or cfg.metrics))
    if given is not None:
        query_labels = ref_labels = None
    result = evaluate(query_emb, query_labels, ref_emb, ref_labels, relevance=given,
                      metrics=names, similarity=cfg.similarity,
                      chunk_size=cfg.chunk_size, device=device, progress=bars_shown(show_progress), query_ref_index=own,
                      query_groups=query_groups, ref_groups=None if ref_emb is None else ref_groups,
                      query_categories=query_categories(query))
    if "media" in query.metadata and "templates" in query.metadata and "template_pairs" in query.metadata:
        result.metrics |= verification_metrics(items, query.metadata["media"], query.metadata["templates"],
                                               query.metadata["template_pairs"], similarity=cfg.similarity,
                                               **({"fars": fars} if fars else {}))
    elif fars:
        if ref is not None:
            raise ValueError("tar@far metrics over all pairs serve self-retrieval (one split); a query/gallery "
                             "protocol verifies its pairs file (templates)")
        result.metrics |= all_pairs_tar_at_far(query_emb, query_labels, fars, similarity=cfg.similarity)
    return result


def label_levels(dataset: Dataset) -> int:
    """The number of label levels (columns) of ``dataset``, read from its labels (no image is decoded)."""
    labels = np.asarray(dataset.labels)  # type: ignore[attr-defined]
    return 1 if labels.ndim < 2 else int(labels.shape[1])


def check_eval_metrics(datasets: Mapping[str, Dataset], metrics: Sequence[str], source: str = "eval.metrics") -> None:
    """Check ``metrics`` (named by ``source`` in errors) against the splits to score, before embedding them: every
    name parses and every ``ap@level{c}`` has its label column (:func:`rankopt.metrics.check_metrics`). The
    Revisited Oxford/Paris protocol (a query split with ``ground_truth``) scores its own metrics: names only."""
    first = next(iter(datasets.values()), None)
    revisited = first is None or "ground_truth" in (getattr(first, "metadata", None) or {})
    check_metrics(metrics, None if revisited else label_levels(first), source=source)


def evaluate_model(model: torch.nn.Module, datasets: Mapping[str, Dataset], cfg: EvalConfig, *,
                   device: torch.device | str = "cpu", num_workers: int = 0, amp: str = "none",
                   show_progress: bool = True, metrics: Sequence[str] | None = None,
                   batch_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                   postprocessing: PostProcessing | None = None,
                   relevance: str = "none") -> tuple[Any, list[EmbeddedSplit]]:
    """Embed each split of ``datasets`` (ordered: self-retrieval split, or query then gallery) and score them.

    ``postprocessing``: the model embeds at its scales; the returned splits are whitened; DBA/αQE act
    in :func:`score` only. The metrics are checked against the splits' label levels before anything is
    embedded (:func:`check_eval_metrics`); with a multi-label ``relevance`` (:func:`score`), the splits' multi-label
    items are checked for instead (their grades are the levels)."""
    if uses_multilabels(relevance):
        check_splits(datasets, f"relevance={relevance!r}")
        check_evaluation(relevance, getattr(next(iter(datasets.values()), None), "metadata", None) or {},
                         metrics or cfg.metrics)
        check_metrics(metrics or cfg.metrics, source="metrics" if metrics else "eval.metrics")
    else:
        check_eval_metrics(datasets, metrics or cfg.metrics, "metrics" if metrics else "eval.metrics")
    post = postprocessing or PostProcessing()
    embedder = post.wrap_model(model)
    splits = [embed_dataset(embedder, ds, batch_size=cfg.batch_size, device=device, num_workers=num_workers,
                            amp=amp, show_progress=show_progress, desc=f"embedding {name}",
                            batch_transform=batch_transform)
              for name, ds in datasets.items()]
    splits = [dataclasses.replace(split, embeddings=post.whiten(split.embeddings)) for split in splits]
    rank, _ = _distributed()
    return score(splits, cfg, device=device, metrics=metrics, show_progress=show_progress and rank == 0,
                 postprocessing=post.without_whitening(), relevance=relevance), splits
