"""A searchable gallery of embeddings made by one model: build, search, add, save, load.

Exact search by default (:func:`rankopt.metrics.search.chunked_topk`: chunked matrix products,
bounded memory, CPU or CUDA); faiss indexes for large galleries from faiss's factory strings
(``"Flat"``, ``"IVF4096,PQ64"``, ``"HNSW32"``), their recall@10 against exact search measured when
built. Every index carries the ``fingerprint`` of the model and preprocessing its embeddings were
made with (:mod:`rankopt.models.fingerprint`); queries and additions from another model are refused.

The landmark toolbox (:mod:`rankopt.postprocess`) joins in: multi-scale embedding and whitening
are part of the index's embedding pipeline (and fingerprint) and are applied to image queries
too; database-side augmentation (DBA) rewrites the indexed vectors when the index is built; αQE
expands the queries at search time (``search(..., qe=Expansion(k, alpha))``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch
from torch import nn

from rankopt import checks
from rankopt.data.base import RetrievalDataset
from rankopt.engine.logging import echo
from rankopt.metrics.search import chunked_topk
from rankopt.postprocess import MULTISCALE_KEY, Expansion, PostProcessing, alpha_query_expansion, database_augmentation
from rankopt.search import approximate, storage
from rankopt.search.embedder import Embedder, ImageSource, as_dataset, base_preprocessing
from rankopt.similarity import SIMILARITIES

Embeddings = torch.Tensor | np.ndarray
LabelNames = list[list[str]]
"""``names[c][i]``: the name of label id ``i`` at level ``c`` (column 0 finest)."""


@dataclass
class SearchResult:
    """The top-``k`` of each query: ``scores``/``ids`` ``(Q, k)`` by decreasing score (``id = -1``, score
    ``-inf``: an approximate index found fewer than ``k``), the items' ``paths`` and ``labels`` ``(Q, k, L)``
    (``-1``: unknown), the queries' paths and labels (``-1``: unknown) when the queries were images."""

    scores: torch.Tensor
    ids: torch.Tensor
    paths: list[list[str | None]]
    labels: torch.Tensor
    level_names: tuple[str, ...]
    label_names: LabelNames | None = None
    query_paths: list[str] | None = None
    query_labels: torch.Tensor | None = None
    note: str = ""
    """Set when ``k`` was capped to the index size."""

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def label_text(self, label: int, level: int = 0) -> str | int | None:
        """The name of ``label`` at ``level`` when the index has names, else the id; ``None`` for ``-1``."""
        if label < 0:
            return None
        return self.label_names[level][label] if self.label_names is not None else int(label)

    def records(self) -> list[dict[str, Any]]:
        """One JSON-able dict per query: ``{"query": path or row, "query_label": ... (when known),
        "results": [{"rank", "id", "path", "score", "label"}, ...]}`` (labels at the finest level)."""
        out = []
        for q in range(len(self)):
            record: dict[str, Any] = {"query": self.query_paths[q] if self.query_paths is not None else q}
            if self.query_labels is not None and int(self.query_labels[q, 0]) >= 0:
                record["query_label"] = self.label_text(int(self.query_labels[q, 0]))
            record["results"] = [
                {"rank": rank, "id": item, "path": self.paths[q][rank - 1], "score": float(self.scores[q, rank - 1]),
                 "label": self.label_text(int(self.labels[q, rank - 1, 0]))}
                for rank, item in enumerate(self.ids[q].tolist(), start=1) if item >= 0]
            out.append(record)
        return out


class Index:
    """Embeddings ``(N, D)`` of a gallery with their labels ``(N, L)`` (``-1``: unknown), paths and the
    fingerprint of the model that made them; searched exactly, or through a faiss index when built with one.

    Build with :meth:`build` (a model and images) or :meth:`from_embeddings`; persist with
    :meth:`save` / :meth:`load`.
    """

    def __init__(self, embeddings: torch.Tensor, labels: torch.Tensor, paths: list[str] | None, *,
                 fingerprint: str, preprocessing: Mapping[str, Any], similarity: str,
                 level_names: Sequence[str] = ("class",), label_names: LabelNames | None = None,
                 faiss_index: Any = None, info: Mapping[str, Any] | None = None, embedder: Embedder | None = None,
                 post: PostProcessing | None = None) -> None:
        if similarity not in SIMILARITIES:
            raise ValueError(f"unknown similarity {similarity!r}; use one of {', '.join(SIMILARITIES)}")
        self.embeddings = embeddings
        self.labels = labels
        self.paths = paths
        self.fingerprint = fingerprint
        self.preprocessing = dict(preprocessing)
        self.similarity = similarity
        self.level_names = tuple(level_names)
        self.label_names = label_names
        self.faiss_index = faiss_index
        self.info: dict[str, Any] = dict(info or {})
        """``checkpoint``, ``model`` (summary), ``faiss`` (spec, params, recall), ``dba`` (k, alpha), ``created_utc``."""
        self.embedder = embedder
        self.post = post
        """The multi-scale and whitening steps of the embedding pipeline (applied to image queries too)."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, model_or_checkpoint: nn.Module | Embedder | str | os.PathLike[str], images_or_dataset: ImageSource, *,
              transform: Any = None, preprocessing: Mapping[str, Any] | None = None, similarity: str = "cosine",
              postprocessing: PostProcessing | None = None, faiss: str | None = None,
              faiss_params: str | None = None, batch_size: int = 256, device: str = "auto", num_workers: int = 0,
              progress: bool = True) -> Index:
        """Embed ``images_or_dataset`` (a dataset, an image folder, or image files/folders) and index them.

        ``model_or_checkpoint``: a checkpoint path (model, test transform and ``preprocessing`` from its
        config) or an ``nn.Module`` with ``preprocessing`` (required) and ``transform`` (default: built
        from ``preprocessing``); see :class:`~rankopt.search.embedder.Embedder`. ``faiss``: a faiss
        factory string (exact search when ``None``); ``faiss_params``: e.g. ``"nprobe=32"``.
        ``postprocessing``: multi-scale and whitening join the embedding pipeline (and the fingerprint);
        DBA rewrites the indexed vectors; αQE belongs to :meth:`search` (``qe=``).
        """
        if postprocessing is not None and postprocessing.qe is not None:
            raise ValueError("query expansion applies to queries: pass qe= to Index.search (rankopt search --qe)")
        options = {"device": device, "batch_size": batch_size, "num_workers": num_workers, "progress": progress}
        if isinstance(model_or_checkpoint, Embedder):
            embedder = model_or_checkpoint
        elif isinstance(model_or_checkpoint, nn.Module):
            embedder = Embedder.from_model(model_or_checkpoint, transform=transform, preprocessing=preprocessing, **options)
        else:
            if transform is not None or preprocessing is not None:
                raise ValueError("transform/preprocessing come from the checkpoint's config; pass an nn.Module "
                                 "to choose them")
            embedder = Embedder.from_checkpoint(model_or_checkpoint, **options)
        embedder = embedder.with_postprocessing(postprocessing)
        dataset = as_dataset(images_or_dataset, embedder.transform, class_tree=True)
        split = embedder.embed(dataset)
        info: dict[str, Any] = {"checkpoint": embedder.checkpoint, "model": embedder.summary}
        vectors = split.embeddings
        if postprocessing is not None and postprocessing.dba is not None:
            vectors = database_augmentation(vectors, postprocessing.dba, similarity=similarity)
            info["dba"] = dataclasses.asdict(postprocessing.dba)
        index = cls(vectors, split.labels, split.paths, fingerprint=embedder.fingerprint,
                    preprocessing=embedder.preprocessing, similarity=similarity, level_names=dataset.level_names,
                    label_names=dataset_label_names(dataset), info=info, embedder=embedder, post=embedder.post)
        return index._with_faiss(faiss, faiss_params, progress)

    @classmethod
    def from_embeddings(cls, embeddings: Embeddings, paths: Sequence[str] | None = None,
                        labels: Embeddings | None = None, *, fingerprint: str, similarity: str = "cosine",
                        preprocessing: Mapping[str, Any] | None = None, level_names: Sequence[str] | None = None,
                        faiss: str | None = None, faiss_params: str | None = None, progress: bool = True) -> Index:
        """An index of your own vectors; ``fingerprint`` names the model that made them (queries given as
        embeddings with another fingerprint are refused)."""
        x = _embeddings(embeddings, "embeddings")
        y = _labels(labels, x.shape[0])
        item_paths = _paths(paths, x.shape[0])
        names = tuple(level_names) if level_names is not None else _default_level_names(y.shape[1])
        if len(names) != y.shape[1]:
            raise ValueError(f"{len(names)} level names for labels with {y.shape[1]} levels")
        index = cls(x, y, item_paths, fingerprint=fingerprint, preprocessing=preprocessing or {},
                    similarity=similarity, level_names=names)
        return index._with_faiss(faiss, faiss_params, progress)

    def _with_faiss(self, spec: str | None, params: str | None, show_progress: bool) -> Index:
        self.info.setdefault("created_utc", f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S UTC}")
        if spec is None:
            if params is not None:
                raise ValueError("faiss_params given without a faiss index spec")
            return self
        self.faiss_index = approximate.build(self.embeddings, spec, self.similarity, params, show_progress=show_progress)
        self.info["faiss"] = {"spec": spec, "params": params, "recall": None}
        self._measure_recall()
        return self

    def _measure_recall(self) -> None:
        """recall@10 vs exact search of an approximate faiss index (not of a flat one), printed and stored."""
        faiss = approximate.import_faiss()
        if isinstance(self.faiss_index, faiss.IndexFlat) or len(self) < 2:
            return
        recall = approximate.measure_recall(self.faiss_index, self.embeddings, self.similarity)
        self.info["faiss"]["recall"] = recall
        echo(f"faiss {self.info['faiss']['spec']}: recall@{recall['k']} vs exact = {recall['value']:.3f} "
             f"on {recall['queries']} queries")

    # ------------------------------------------------------------------ properties
    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @property
    def backend(self) -> str:
        """``"exact"`` or ``"faiss <spec>"``."""
        return f"faiss {self.info['faiss']['spec']}" if self.faiss_index is not None else "exact"

    def __repr__(self) -> str:
        return (f"Index({len(self)} items, dim={self.dim}, {self.similarity}, {self.backend}, "
                f"fingerprint={self.fingerprint})")

    # ------------------------------------------------------------------ search
    def search(self, queries: Embeddings | ImageSource, k: int = 10, *, fingerprint: str | None = None,
               model: nn.Module | Embedder | None = None, checkpoint: str | os.PathLike[str] | None = None,
               qe: Expansion | None = None) -> SearchResult:
        """The top-``k`` items of each query (``k`` capped to the index size, said in ``note``).

        ``qe``: αQE, each query replaced by ``normalize(q + Σ_{i≤k} max(s_i, 0)^α g_i)`` over its top
        ``qe.k`` indexed vectors (exact search) before the search (ICCV'19 §5: k = 10, α = 2).

        ``queries``: embeddings ``(Q, D)`` (with the ``fingerprint`` they were made with, checked when
        given) or images (a dataset, files, folders), embedded by the index's model: the one it was
        built with, ``model=``/``checkpoint=``, or the checkpoint recorded in the index.
        """
        query_paths = query_labels = None
        if isinstance(queries, (torch.Tensor, np.ndarray)):
            if model is not None or checkpoint is not None:
                raise ValueError("model=/checkpoint= embed image queries; these queries are already embeddings")
            if fingerprint is not None and fingerprint != self.fingerprint:
                raise ValueError(f"the queries' fingerprint {fingerprint} is not the index's {self.fingerprint}: "
                                 "they were embedded by another model or preprocessing")
            q = _embeddings(queries, "queries")
        else:
            if fingerprint is not None:
                raise ValueError("fingerprint= describes query embeddings; image queries are checked by their model")
            split = self._embedder(model, checkpoint).embed(queries, desc="embedding queries")
            q, query_paths = _embeddings(split.embeddings, "query embeddings"), split.paths
            query_labels = self.labels_of_paths(query_paths)
        if q.shape[1] != self.dim:
            raise ValueError(f"the queries have dimension {q.shape[1]} but the index holds {self.dim}-d embeddings")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if len(self) == 0:
            raise ValueError("the index is empty")
        if qe is not None:
            q = alpha_query_expansion(q, self.embeddings, qe, similarity=self.similarity)
        kept = min(k, len(self))
        note = f"k={k} capped to {kept}: the index holds {len(self)} items" if kept < k else ""
        if self.faiss_index is not None:
            scores, ids = approximate.search(self.faiss_index, q, kept, self.similarity)
        else:
            device = self.embedder.device if self.embedder is not None else torch.device("cpu")
            scores, ids = chunked_topk(q.to(device), self.embeddings.to(device), kept, similarity=self.similarity)
            scores, ids = scores.cpu(), ids.cpu()
        found = ids.clamp(min=0)
        labels = self.labels[found].masked_fill((ids < 0).unsqueeze(-1), -1)
        paths = [[self.paths[j] if self.paths is not None and j >= 0 else None for j in row] for row in ids.tolist()]
        return SearchResult(scores.float(), ids, paths, labels, self.level_names, self.label_names,
                            query_paths, query_labels, note)

    def _embedder(self, model: nn.Module | Embedder | None, checkpoint: str | os.PathLike[str] | None) -> Embedder:
        """The embedder of image queries or additions, its fingerprint checked against the index's."""
        if model is not None and checkpoint is not None:
            raise ValueError("pass model= or checkpoint=, not both")
        if isinstance(model, Embedder):
            embedder = model
        elif model is not None:
            embedder = Embedder.from_model(model, preprocessing=base_preprocessing(self.preprocessing))
        elif checkpoint is not None:
            embedder = Embedder.from_checkpoint(checkpoint)
        elif self.embedder is not None:
            embedder = self.embedder
        elif self.info.get("checkpoint"):
            path = Path(self.info["checkpoint"])
            if not path.is_file():
                raise FileNotFoundError(f"the index's checkpoint {str(path)!r} does not exist: pass checkpoint= "
                                        "(rankopt search --checkpoint) to embed image queries")
            embedder = self.embedder = Embedder.from_checkpoint(path)
        else:
            raise ValueError("this index records no model: pass model= or checkpoint= to embed images, "
                             "or give embeddings")
        if embedder.post is None:
            embedder = embedder.with_postprocessing(self.post)
        embedder.require_fingerprint(self.fingerprint, self.preprocessing)
        return embedder

    def labels_of_paths(self, paths: Sequence[str]) -> torch.Tensor:
        """``(Q, L)`` labels of images given by path: an image lying in a folder whose trailing path
        components name a class of the index (``.../a/1/x.png`` and class ``a/1``) gets that class's
        labels, any other ``-1``."""
        out = torch.full((len(paths), self.labels.shape[1]), -1, dtype=torch.long)
        if self.label_names is None:
            return out
        finest = {name: i for i, name in enumerate(self.label_names[0])}
        rows = {int(label): row for row, label in reversed(list(enumerate(self.labels[:, 0].tolist())))}
        for q, path in enumerate(paths):
            parts = PurePath(path).parent.parts
            for depth in range(1, len(parts) + 1):
                label = finest.get("/".join(parts[-depth:]))
                if label is not None and label in rows:
                    out[q] = self.labels[rows[label]]
                    break
        return out

    # ------------------------------------------------------------------ add
    def add(self, images_or_embeddings: Embeddings | ImageSource, paths: Sequence[str] | None = None,
            labels: Embeddings | None = None, *, fingerprint: str | None = None,
            model: nn.Module | Embedder | None = None, checkpoint: str | os.PathLike[str] | None = None) -> Index:
        """Append embeddings (with the ``fingerprint`` they were made with, checked when given) or images
        (embedded like image queries, their labels and class names merged by name); returns ``self``.
        An index built with DBA cannot grow: its vectors depend on each other (rebuild it instead)."""
        if self.info.get("dba"):
            raise ValueError(f"this index was built with database-side augmentation (DBA {self.info['dba']}): each "
                             "vector depends on its neighbours, so items cannot be added; rebuild the index")
        if isinstance(images_or_embeddings, (torch.Tensor, np.ndarray)):
            if fingerprint is not None and fingerprint != self.fingerprint:
                raise ValueError(f"the added embeddings' fingerprint {fingerprint} is not the index's {self.fingerprint}")
            x = _embeddings(images_or_embeddings, "added embeddings")
            y, names, new_paths = _labels(labels, x.shape[0]), None, _paths(paths, x.shape[0])
        else:
            if paths is not None or labels is not None or fingerprint is not None:
                raise ValueError("paths=/labels=/fingerprint= go with embeddings; images bring their own")
            embedder = self._embedder(model, checkpoint)
            dataset = as_dataset(images_or_embeddings, embedder.transform, class_tree=True)
            split = embedder.embed(dataset, desc="embedding additions")
            x, y, names, new_paths = split.embeddings, split.labels, dataset_label_names(dataset), split.paths
        if x.shape[1] != self.dim:
            raise ValueError(f"the added embeddings have dimension {x.shape[1]} but the index holds {self.dim}-d ones")
        if (self.paths is None) != (new_paths is None) and len(self):
            raise ValueError("the index has item paths and the additions have none, or the reverse: give paths= "
                             "for every item or for none")
        y = self._merge_labels(y, names)
        if self.faiss_index is not None:
            approximate.add(self.faiss_index, x, self.similarity, show_progress=False)
        self.embeddings = torch.cat([self.embeddings, x])
        self.labels = torch.cat([self.labels, y])
        self.paths = None if new_paths is None else [*(self.paths or []), *new_paths]
        if self.faiss_index is not None:
            self._measure_recall()
        return self

    def _merge_labels(self, labels: torch.Tensor, names: LabelNames | None) -> torch.Tensor:
        """``labels`` in the index's label ids: translated by class name when both sides have names."""
        levels = self.labels.shape[1]
        if bool((labels < 0).all()):
            return torch.full((labels.shape[0], levels), -1, dtype=torch.long)
        if labels.shape[1] != levels:
            raise ValueError(f"the added labels have {labels.shape[1]} levels, the index's {levels}")
        if (self.label_names is None) != (names is None):
            raise ValueError("the index's labels are class names and the additions' are bare ids, or the reverse: "
                             "they cannot be matched")
        if names is None or self.label_names is None:
            return labels
        out = labels.clone()
        for level in range(levels):
            known = {name: i for i, name in enumerate(self.label_names[level])}
            for label in labels[:, level].unique().tolist():
                if label >= 0:
                    name = names[level][label]
                    if name not in known:
                        known[name] = len(self.label_names[level])
                        self.label_names[level].append(name)
                    out[labels[:, level] == label, level] = known[name]
        return out

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the index folder (see :mod:`rankopt.search.storage`) atomically."""
        from rankopt import __version__

        info = {"format": storage.FORMAT, "format_version": storage.FORMAT_VERSION, "rankopt_version": __version__,
                "fingerprint": self.fingerprint, "preprocessing": self.preprocessing, "similarity": self.similarity,
                "dim": self.dim, "count": len(self), "checkpoint": self.info.get("checkpoint"),
                "model": self.info.get("model"), "faiss": self.info.get("faiss"), "dba": self.info.get("dba"),
                "created_utc": self.info.get("created_utc")}
        items = {"paths": self.paths, "level_names": list(self.level_names), "label_names": self.label_names}
        whitening = None if self.post is None else self.post.whitening
        return storage.write(directory, storage.StoredIndex(self.embeddings, self.labels, info, items,
                                                            self.faiss_index, whitening))

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Index:
        """Read an index folder written by :meth:`save`, validating every file."""
        stored = storage.read(directory)
        items = stored.items
        level_names = items.get("level_names") or _default_level_names(stored.labels.shape[1])
        label_names = items.get("label_names")
        if len(level_names) != stored.labels.shape[1] or (label_names is not None and len(label_names) != len(level_names)):
            raise ValueError(f"{Path(directory) / storage.ITEMS_JSON}: {len(level_names)} level names for labels with "
                             f"{stored.labels.shape[1]} levels")
        if label_names is not None:
            top = stored.labels.max(dim=0).values.tolist()
            for level, (names, largest) in enumerate(zip(label_names, top)):
                if largest >= len(names):
                    raise ValueError(f"{Path(directory) / storage.ITEMS_JSON}: {len(names)} label names at level "
                                     f"{level} but {storage.EMBEDDINGS} uses label {largest}")
        info = {key: stored.info.get(key) for key in ("checkpoint", "model", "faiss", "dba", "created_utc")}
        preprocessing = stored.info.get("preprocessing") or {}
        scales = preprocessing.get(MULTISCALE_KEY)
        post = (PostProcessing(tuple(scales) if scales else None, stored.whitening)
                if scales or stored.whitening is not None else None)
        return cls(stored.embeddings, stored.labels, items.get("paths"), fingerprint=stored.info["fingerprint"],
                   preprocessing=preprocessing, similarity=stored.info["similarity"], level_names=level_names,
                   label_names=label_names, faiss_index=stored.faiss_index, info=info, post=post)


# ---------------------------------------------------------------------- helpers
def _embeddings(x: Embeddings, name: str) -> torch.Tensor:
    tensor = torch.from_numpy(np.asarray(x)) if isinstance(x, np.ndarray) else x
    return checks.check_embeddings(tensor, name).detach().float().cpu()


def _labels(labels: Embeddings | None, rows: int) -> torch.Tensor:
    if labels is None:
        return torch.full((rows, 1), -1, dtype=torch.long)
    tensor = torch.from_numpy(np.asarray(labels)) if isinstance(labels, np.ndarray) else labels
    return checks.check_labels(tensor, rows, "labels").cpu()


def _paths(paths: Sequence[str] | None, rows: int) -> list[str] | None:
    if paths is None:
        return None
    if len(paths) != rows:
        raise ValueError(f"{len(paths)} paths for {rows} embeddings")
    return [str(p) for p in paths]


def _default_level_names(levels: int) -> tuple[str, ...]:
    return ("class", *(f"level{c}" for c in range(1, levels)))


def dataset_label_names(dataset: RetrievalDataset) -> LabelNames | None:
    """Class names by label id at each level (``dataset.metadata["label_names"]``, which the data loaders
    fill from the raw labels: :func:`rankopt.data.base.label_names`); ``None``: bare ids."""
    given = dataset.metadata.get("label_names")
    return None if given is None else [list(level) for level in given]
