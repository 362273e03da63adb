"""A searchable gallery of embeddings made by one model: build, search, add, remove, update, save, load.

Exact search by default (:mod:`rankopt.search.backend`: chunked matrix products,
bounded memory, CPU or CUDA); faiss indexes for large galleries from faiss's factory strings
(``"Flat"``, ``"IVF4096,PQ64"``, ``"HNSW32"``), their recall@10 against exact search measured when
built. Every index carries the ``fingerprint`` of the model and preprocessing its embeddings were
made with (:mod:`rankopt.models.fingerprint`); queries and additions from another model are refused.

The landmark toolbox (:mod:`rankopt.postprocess`) joins in: multi-scale embedding and whitening are part of the
index's embedding pipeline (and fingerprint) and are applied to image queries too; database-side augmentation (DBA)
rewrites the indexed vectors (the model's own are kept, so a DBA index can still change: every change recomputes the
augmentation of all items, as a fresh build would); αQE expands the queries at search time (its own or ``qe=``).

Items keep stable string ids through every change (:mod:`rankopt.search.items`), carry metadata
columns that results return and filters select on (:mod:`rankopt.search.metadata`; a filtered search
is exact, over the items the filter keeps, whatever the backend), and a calibrated ``threshold``
(:mod:`rankopt.search.threshold`) marks each result as a match (``score >= threshold``) or not.
Saving is atomic (:mod:`rankopt.search.storage`); :meth:`Index.editing` loads, changes and saves a
folder under its writers' lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import nn

from rankopt.checks import cpu_embeddings, cpu_labels
from rankopt.engine.embed_and_score import EmbeddedSplit
from rankopt.postprocess import Expansion, PostProcessing
from rankopt.search import storage
from rankopt.search.approximate import Faiss
from rankopt.search.settings import EMBED, INDEX
from rankopt.search.backend import Backend, Exact, exact_search
from rankopt.search.embedder import Embedder, ImageSource, base_preprocessing, stored_post
from rankopt.search.items import IndexItems, changed_files, crop_dataset, dataset_items, item_paths
from rankopt.search.label_names import (default_level_names, dataset_label_names, label_texts, labels_of_paths,
                                   merge_labels)
from rankopt.search.metadata import LABEL_KEY, Columns, Filter, MetadataSource, aligned_columns, filter_mask
from rankopt.search.qdrant import Qdrant
from rankopt.search.record import IndexInfo
from rankopt.search.result import LabelNames, SearchResult
from rankopt.similarity import SIMILARITIES

Embeddings = torch.Tensor | np.ndarray


class Index:
    """Embeddings ``(N, D)`` of a gallery with their labels ``(N, L)`` (``-1``: unknown), items (stable ids,
    paths, metadata: :class:`~rankopt.search.items.IndexItems`) and the fingerprint of the model that made them;
    searched by its :attr:`searcher` (:mod:`rankopt.search.backend`: exact, faiss or Qdrant).

    Build with :meth:`build` (a model and images) or :meth:`from_embeddings`; change with :meth:`add`,
    :meth:`remove`, :meth:`update`; persist with :meth:`save` / :meth:`load` (or :meth:`editing`).
    """

    def __init__(self, embeddings: torch.Tensor, labels: torch.Tensor, items: IndexItems | Sequence[str] | None, *,
                 fingerprint: str, preprocessing: Mapping[str, Any], similarity: str,
                 level_names: Sequence[str] = ("class",), label_names: LabelNames | None = None,
                 faiss_index: Any = None, record: IndexInfo | None = None, embedder: Embedder | None = None,
                 post: PostProcessing | None = None, unaugmented: torch.Tensor | None = None) -> None:
        if similarity not in SIMILARITIES:
            raise ValueError(f"unknown similarity {similarity!r}; use one of {', '.join(SIMILARITIES)}")
        self.embeddings = embeddings
        self.labels = labels
        self.items = items if isinstance(items, IndexItems) else IndexItems.new(int(embeddings.shape[0]), items)
        if len(self.items) != embeddings.shape[0]:
            raise ValueError(f"{len(self.items)} items for {embeddings.shape[0]} embeddings")
        self.fingerprint = fingerprint
        self.preprocessing = dict(preprocessing)
        self.similarity = similarity
        self.level_names = tuple(level_names)
        self.label_names = label_names
        self.record = record or IndexInfo()
        """Its provenance and backend settings as ``index.json`` stores them."""
        if unaugmented is not None and tuple(unaugmented.shape) != tuple(embeddings.shape):
            raise ValueError(f"{tuple(unaugmented.shape)} vectors before DBA for {tuple(embeddings.shape)} embeddings")
        self.unaugmented = unaugmented
        """With DBA: the model's vectors that :attr:`embeddings` were augmented from (else ``None``)."""
        self.searcher: Backend = (Qdrant(self.record.qdrant) if self.record.qdrant else
                                  Faiss(faiss_index, self.record.faiss, similarity) if faiss_index is not None else
                                  Exact())
        """How it is searched (:meth:`_with_faiss` and :func:`rankopt.search.qdrant.attach` choose another)."""
        self.embedder = embedder
        self.post = post
        """The multi-scale and whitening steps of the embedding pipeline (applied to image queries too)."""
        self.folder: Path | None = None
        """The folder it was loaded from or last saved to (a Qdrant collection is searched once it is set)."""

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, model_or_checkpoint: nn.Module | Embedder | str | os.PathLike[str], images_or_dataset: ImageSource,
              *, transform: Any = None, preprocessing: Mapping[str, Any] | None = None,
              similarity: str = INDEX.similarity, postprocessing: PostProcessing | None = None,
              faiss: str | None = None, faiss_params: str | None = None, metadata: MetadataSource | None = None,
              batch_size: int = EMBED.batch_size, device: str = EMBED.device, num_workers: int = EMBED.num_workers,
              progress: bool = True, runtime: str | None = None, skipped: list[str] | None = None) -> Index:
        """Embed ``images_or_dataset`` (a dataset, an image folder, or image files/folders) and index them.

        ``model_or_checkpoint``: a checkpoint path (model, test transform and ``preprocessing`` from its
        config) or an ``nn.Module`` with ``preprocessing`` (required) and ``transform`` (default: built
        from ``preprocessing``); see :class:`~rankopt.search.embedder.Embedder`. ``faiss``: a faiss
        factory string (exact search when ``None``); ``faiss_params``: e.g. ``"nprobe=32"``.
        ``postprocessing``: multi-scale and whitening join the embedding pipeline (and the fingerprint);
        DBA rewrites the indexed vectors; αQE belongs to :meth:`search` (``qe=``). ``metadata``: a ``.csv``
        / ``.parquet`` file or a ``{path: row}`` table keyed by image path, besides a dataset's own columns
        (a CSV dataset's ``id`` column gives the ids). ``runtime``: what runs a checkpoint's forward (``auto``,
        ``torch``, ``onnx``; :mod:`rankopt.export.runtimes`; default ``$RANKOPT_RUNTIME``, else ``auto``).
        ``skipped``: unreadable images are left out and listed there (:meth:`Embedder.embed_images`).
        """
        options = {"device": device, "batch_size": batch_size, "num_workers": num_workers, "progress": progress}
        if isinstance(model_or_checkpoint, Embedder):
            embedder = model_or_checkpoint
        elif isinstance(model_or_checkpoint, nn.Module):
            embedder = Embedder.from_model(model_or_checkpoint, transform=transform, preprocessing=preprocessing,
                                           **options)
        else:
            if transform is not None or preprocessing is not None:
                raise ValueError("transform/preprocessing come from the checkpoint's config; pass an nn.Module "
                                 "to choose them")
            embedder = Embedder.from_checkpoint(model_or_checkpoint, runtime=runtime, **options)
        embedder = embedder.with_postprocessing(postprocessing)
        dataset, split = embedder.embed_images(images_or_dataset, skipped=skipped)
        return cls.from_split(embedder, dataset, split, similarity=similarity, postprocessing=postprocessing,
                              faiss=faiss, faiss_params=faiss_params, metadata=metadata, progress=progress)

    @classmethod
    def from_split(cls, embedder: Embedder, dataset: Any, split: EmbeddedSplit, *, similarity: str = INDEX.similarity,
                   postprocessing: PostProcessing | None = None, faiss: str | None = None,
                   faiss_params: str | None = None, metadata: MetadataSource | None = None,
                   progress: bool = True) -> Index:
        """The index of ``dataset`` embedded into ``split`` by ``embedder`` (``postprocessing``'s embedding steps
        set), as :meth:`build` makes it: DBA rewrites the vectors, αQE is stored for every later search."""
        record = IndexInfo(checkpoint=embedder.checkpoint, model=embedder.summary)
        vectors, unaugmented = split.embeddings, None
        if postprocessing is not None and postprocessing.dba is not None:
            unaugmented = vectors
            vectors = postprocessing.augment(vectors, similarity=similarity)
            record.dba = dataclasses.asdict(postprocessing.dba)
        if postprocessing is not None and postprocessing.qe is not None:
            record.qe = dataclasses.asdict(postprocessing.qe)
        items = IndexItems.new(len(split.paths), split.paths, **dataset_items(dataset, split.paths, metadata))
        index = cls(vectors, split.labels, items, fingerprint=embedder.fingerprint,
                    preprocessing=embedder.preprocessing, similarity=similarity, level_names=dataset.level_names,
                    label_names=dataset_label_names(dataset), record=record, embedder=embedder, post=embedder.post,
                    unaugmented=unaugmented)
        return index._with_faiss(faiss, faiss_params, progress)

    @classmethod
    def from_embeddings(cls, embeddings: Embeddings, paths: Sequence[str] | None = None,
                        labels: Embeddings | None = None, *, fingerprint: str, similarity: str = INDEX.similarity,
                        preprocessing: Mapping[str, Any] | None = None, level_names: Sequence[str] | None = None,
                        label_names: LabelNames | None = None, ids: Sequence[str] | None = None,
                        metadata: MetadataSource | Columns | None = None, faiss: str | None = None,
                        faiss_params: str | None = None, progress: bool = True) -> Index:
        """An index of your own vectors; ``fingerprint`` names the model that made them (queries given as
        embeddings with another fingerprint are refused). ``ids``: one string per row (default ``"0"``, ...);
        ``metadata``: ``{column: values}`` aligned with the rows, or a file / table keyed by path;
        ``label_names``: class names by label id per level."""
        x = cpu_embeddings(embeddings, "embeddings")
        y = cpu_labels(labels, x.shape[0])
        paths = item_paths(paths, x.shape[0])
        names = tuple(level_names) if level_names is not None else default_level_names(y.shape[1])
        if len(names) != y.shape[1]:
            raise ValueError(f"{len(names)} level names for labels with {y.shape[1]} levels")
        columns, _ = aligned_columns(metadata, paths, x.shape[0])
        items = IndexItems.new(x.shape[0], paths, ids=ids, metadata=columns)
        index = cls(x, y, items, fingerprint=fingerprint, preprocessing=preprocessing or {},
                    similarity=similarity, level_names=names, label_names=label_names)
        return index._with_faiss(faiss, faiss_params, progress)

    def _with_faiss(self, spec: str | None, params: str | None, show_progress: bool) -> Index:
        self.record.created_utc = self.record.created_utc or f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S UTC}"
        if spec is None:
            if params is not None:
                raise ValueError("faiss_params given without a faiss index spec")
            return self
        self.searcher = Faiss.build(self, spec, params, show_progress=show_progress)
        self.record.faiss = self.searcher.entry
        return self

    # ------------------------------------------------------------------ properties
    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])

    @property
    def info(self) -> Mapping[str, Any]:
        """:attr:`record` as ``index.json`` holds it (a read-only view)."""
        return MappingProxyType(self.record.to_json())

    @property
    def faiss_index(self) -> Any:
        """The faiss index it is searched through, or ``None``."""
        return self.searcher.index if isinstance(self.searcher, Faiss) else None

    @property
    def device(self) -> torch.device:
        """Where the exact search runs: the embedder's device, else the CPU."""
        return self.embedder.device if self.embedder is not None else torch.device("cpu")

    @property
    def ids(self) -> list[str]:
        """The items' stable ids, by row."""
        return self.items.ids

    @property
    def paths(self) -> list[str] | None:
        return self.items.paths

    @property
    def metadata(self) -> Columns:
        """``{column: [value per item]}``."""
        return self.items.metadata

    @property
    def threshold(self) -> dict[str, Any] | None:
        """The calibrated threshold (``value``, ``fmr``, ``fnmr``, ``dataset``, ``split``, ... of
        :func:`rankopt.search.threshold.calibrate`) or ``None``; set it with :meth:`set_threshold`."""
        return self.record.threshold

    def set_threshold(self, threshold: Mapping[str, Any] | None) -> None:
        """Store a threshold (a mapping with a finite ``value``; ``None`` removes it)."""
        if threshold is not None and not np.isfinite(float(threshold.get("value", np.nan))):
            raise ValueError(f"a threshold needs a finite 'value', got {threshold!r}")
        self.record.threshold = None if threshold is None else dict(threshold)

    @property
    def query_expansion(self) -> Expansion | None:
        """The αQE every search applies unless given another (``index.json``'s ``qe``), or ``None``."""
        return None if self.record.qe is None else Expansion(**self.record.qe)

    @property
    def backend(self) -> str:
        """``"exact"``, ``"faiss <spec>"`` or ``"qdrant <collection> (<where>)"``."""
        return self.searcher.describe()

    def __repr__(self) -> str:
        return (f"Index({len(self)} items, dim={self.dim}, {self.similarity}, {self.backend}, "
                f"fingerprint={self.fingerprint})")

    def item(self, id: str) -> dict[str, Any]:
        """``{"id", "path", "label", "labels", "metadata"}`` of the item ``id`` (``label``: the finest, ``labels``:
        by level name; names when the index has them); ``ValueError`` naming an unknown id."""
        row = int(self.items.rows_of(ids=[id])[0])
        labels = [None if v < 0 else self.label_names[c][v] if self.label_names is not None else v
                  for c, v in enumerate(self.labels[row].tolist())]
        return {"id": self.ids[row], "path": None if self.paths is None else self.paths[row], "label": labels[0],
                "labels": dict(zip(self.level_names, labels)), "metadata": {c: v[row]
                                                                            for c, v in self.metadata.items()}}

    # ------------------------------------------------------------------ search
    def search(self, queries: Embeddings | ImageSource, k: int = 10, *, filter: Filter | None = None,
               fingerprint: str | None = None, model: nn.Module | Embedder | None = None,
               checkpoint: str | os.PathLike[str] | None = None, qe: Expansion | None = None) -> SearchResult:
        """The top-``k`` items of each query (``k`` capped to the index size, said in ``note``).

        ``filter``: only items whose metadata it accepts (:mod:`rankopt.search.metadata`: ``{"key": value}``,
        ``{"key": [v1, v2]}``, ``"key=value"``, ``"key in [v1, v2]"`` or a list of such strings, ANDed; the
        column ``label`` is the finest label), searched exactly among those alone (fewer than ``k`` when
        fewer pass, said in ``note``).

        ``qe``: αQE, each query replaced by ``normalize(q + Σ_{i≤k} max(s_i, 0)^α g_i)`` over its top
        ``qe.k`` indexed vectors (exact search) before the search (ICCV'19 §5: k = 10, α = 2); ``None``: the
        index's own (:attr:`query_expansion`, e.g. chosen by ``rankopt fit``), if any; ``Expansion(0)``: none.

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
            q = cpu_embeddings(queries, "queries")
        else:
            if fingerprint is not None:
                raise ValueError("fingerprint= describes query embeddings; image queries are checked by their model")
            split = self.embedder_for(model, checkpoint).embed(queries, desc="embedding queries")
            q, query_paths = cpu_embeddings(split.embeddings, "query embeddings"), split.paths
            query_labels = self.labels_of_paths(query_paths)
        if q.shape[1] != self.dim:
            raise ValueError(f"the queries have dimension {q.shape[1]} but the index holds {self.dim}-d embeddings")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if len(self) == 0:
            raise ValueError("the index is empty")
        qe = self.query_expansion if qe is None else qe
        q = PostProcessing(qe=qe).expand_queries(q, self.embeddings, similarity=self.similarity)
        keep = None if filter is None else np.flatnonzero(self._filter_mask(filter))
        candidates = len(self) if keep is None else keep.size
        kept = min(k, candidates)
        note = "" if kept == k else (f"k={k} capped to {kept}: the index holds {len(self)} items" if keep is None else
                                     f"k={k} capped to {kept}: the filter keeps {keep.size} of {len(self)} items")
        if kept == 0:  # the filter keeps nothing
            scores, rows = torch.empty((q.shape[0], 0)), torch.empty((q.shape[0], 0), dtype=torch.long)
        else:  # a filter the backend cannot apply, or a backend that cannot answer: exact search
            hits = self.searcher.search(self, q, kept, filter) if keep is None or self.searcher.filters else None
            scores, rows = hits if hits is not None else exact_search(self, q, kept, keep)
        return self._result(scores.float(), rows, query_paths, query_labels, note)

    def _filter_mask(self, filter: Filter) -> np.ndarray:
        columns = {**self.metadata, LABEL_KEY: label_texts(self.labels, self.label_names)}
        return filter_mask(columns, len(self), filter)

    def _result(self, scores: torch.Tensor, rows: torch.Tensor, query_paths: list[str] | None,
                query_labels: torch.Tensor | None, note: str) -> SearchResult:
        table = rows.tolist()
        labels = (self.labels[rows.clamp(min=0)].masked_fill((rows < 0).unsqueeze(-1), -1)
                  if any(j < 0 for row in table for j in row) else self.labels[rows])
        ids = [[self.ids[j] if j >= 0 else None for j in row] for row in table]
        paths = [[self.paths[j] if self.paths is not None and j >= 0 else None for j in row] for row in table]
        metadata = None
        if self.metadata:
            metadata = [[{c: v[j] for c, v in self.metadata.items()} if j >= 0 else {} for j in row] for row in table]
        return SearchResult(scores, rows, ids, paths, labels, self.level_names, self.label_names, metadata,
                            None if self.threshold is None else float(self.threshold["value"]), query_paths,
                            query_labels, note)

    def embedder_for(self, model: nn.Module | Embedder | None = None,
                     checkpoint: str | os.PathLike[str] | None = None, **options: Any) -> Embedder:
        """The embedder of image queries or additions: ``model``, else ``checkpoint`` (a ``.onnx`` export runs
        in onnxruntime), else the checkpoint the index records; with the index's multi-scale and whitening
        steps, its fingerprint checked against the index's. ``options``: :class:`Embedder`'s (device,
        batch size, progress)."""
        if model is not None and checkpoint is not None:
            raise ValueError("pass model= or checkpoint=, not both")
        if isinstance(model, Embedder):
            embedder = model
        elif model is not None:
            embedder = Embedder.from_model(model, preprocessing=base_preprocessing(self.preprocessing), **options)
        elif checkpoint is not None:
            if not Path(checkpoint).is_file():
                raise FileNotFoundError(f"checkpoint {str(checkpoint)!r} does not exist")
            embedder = Embedder.from_checkpoint(checkpoint, **options)
        elif self.embedder is not None and not options:
            embedder = self.embedder
        elif self.record.checkpoint:
            path = Path(self.record.checkpoint)
            if not path.is_file():
                raise FileNotFoundError(f"the index's checkpoint {str(path)!r} does not exist: pass checkpoint= "
                                        "(--checkpoint or --onnx on the command line) to embed images")
            embedder = Embedder.from_checkpoint(path, **options)
            if not options:
                self.embedder = embedder
        else:
            raise ValueError("this index records no checkpoint: pass model= or checkpoint= (--checkpoint or --onnx on "
                             "the command line) to embed images, or give embeddings")
        if embedder.post is None:
            embedder = embedder.with_postprocessing(self.post)
        embedder.require_fingerprint(self.fingerprint, self.preprocessing)
        return embedder

    def labels_of_paths(self, paths: Sequence[str]) -> torch.Tensor:
        """``(Q, L)`` labels of query images by their folders (:func:`rankopt.search.label_names.labels_of_paths`)."""
        return labels_of_paths(paths, self.labels, self.label_names)

    # ------------------------------------------------------------------ changes
    def add(self, images_or_embeddings: Embeddings | ImageSource, paths: Sequence[str] | None = None,
            labels: Embeddings | None = None, *, ids: Sequence[str] | None = None,
            metadata: MetadataSource | Columns | None = None, fingerprint: str | None = None,
            model: nn.Module | Embedder | None = None, checkpoint: str | os.PathLike[str] | None = None,
            skipped: list[str] | None = None) -> Index:
        """Append embeddings (``fingerprint`` checked when given; ``ids``, ``metadata`` as :meth:`from_embeddings`)
        or images (embedded like image queries, labels merged by class name; ``metadata`` and ``skipped`` as
        :meth:`build`); returns ``self``. New items get new ids; a path already indexed is refused."""
        self._require_changeable("items cannot be added")
        if isinstance(images_or_embeddings, (torch.Tensor, np.ndarray)):
            if fingerprint is not None and fingerprint != self.fingerprint:
                raise ValueError(f"the added embeddings' fingerprint {fingerprint} is not the index's "
                                 f"{self.fingerprint}")
            x = cpu_embeddings(images_or_embeddings, "added embeddings")
            y, names, new_paths = cpu_labels(labels, x.shape[0]), None, item_paths(paths, x.shape[0])
            columns, _ = aligned_columns(metadata, new_paths, x.shape[0], "added metadata")
            new_items = {"ids": ids, "metadata": columns}
        else:
            if paths is not None or labels is not None or fingerprint is not None or ids is not None:
                raise ValueError("paths=/labels=/fingerprint=/ids= go with embeddings; images bring their own")
            embedder = self.embedder_for(model, checkpoint)
            dataset, split = embedder.embed_images(images_or_embeddings, desc="embedding additions", skipped=skipped)
            x, y, names, new_paths = split.embeddings, split.labels, dataset_label_names(dataset), split.paths
            new_items = dataset_items(dataset, new_paths, metadata)
        if x.shape[1] != self.dim:
            raise ValueError(f"the added embeddings have dimension {x.shape[1]} but the index holds {self.dim}-d ones")
        self.items = self.items.extended(x.shape[0], new_paths, **new_items)
        self.labels = torch.cat([self.labels, merge_labels(y, names, self.label_names, self.labels.shape[1])])
        if self.unaugmented is None:
            self.embeddings = torch.cat([self.embeddings, x])
            self.searcher.changed(self, added=x.shape[0])
        else:  # new neighbours move the augmented vectors of old items too
            self._augment(torch.cat([self.unaugmented, x]))
        return self

    def remove(self, ids: Sequence[str] = (), paths: Sequence[str] = ()) -> list[str]:
        """Remove the items with these ``ids`` or ``paths`` (an unknown one is a ``ValueError`` naming it; nothing
        is removed then); returns the removed ids. Removed ids are never given to new items."""
        self._require_changeable("items cannot be removed")
        rows = self.items.rows_of(ids, paths)
        removed = [self.ids[r] for r in rows.tolist()]
        self._keep(np.setdiff1d(np.arange(len(self)), rows))
        return removed

    def update(self, *, model: nn.Module | Embedder | None = None,
               checkpoint: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Re-embed the items whose file changed since indexed (size or mtime moved and sha256 differs) and
        remove those whose file vanished; items without a file stamp (given as embeddings) are left alone.
        Ids, labels and metadata stay. Returns ``{"changed": [ids], "removed": [ids], "checked": n}``."""
        self._require_changeable("items cannot be updated")
        changed, vanished, restamped = changed_files(self.items)
        checked = sum(stamp is not None for stamp in self.items.stamps or [])
        if restamped:
            rows, stamps = zip(*restamped)
            self.items = self.items.with_stamps(rows, stamps)
        result = {"changed": [self.ids[r] for r in changed], "removed": [self.ids[r] for r in vanished],
                  "checked": checked}
        if changed:
            x = self.embedder_for(model, checkpoint).embed(crop_dataset(self.items, changed),
                                                           desc="re-embedding").embeddings
            name = "embeddings" if self.unaugmented is None else "unaugmented"  # DBA: recomputed by _keep below
            setattr(self, name, getattr(self, name).clone())
            getattr(self, name)[torch.tensor(changed)] = cpu_embeddings(x, "re-embedded items")
        if vanished or changed:
            self._keep(np.setdiff1d(np.arange(len(self)), vanished))
        return result

    def _keep(self, rows: np.ndarray) -> None:
        """Keep the items at ``rows`` (sorted), the backend in step with them."""
        take = torch.from_numpy(rows)
        self.labels, self.items = self.labels[take], self.items.selected(rows)
        if self.unaugmented is None:
            self.embeddings = self.embeddings[take]
            self.searcher.changed(self)
        else:
            self._augment(self.unaugmented[take])

    def _augment(self, unaugmented: torch.Tensor) -> None:
        """Every indexed vector recomputed by DBA from the model's as :meth:`from_split` does (O(N²·D))."""
        self.unaugmented = unaugmented
        self.embeddings = PostProcessing(dba=Expansion(**self.record.dba)).augment(unaugmented,
                                                                                  similarity=self.similarity)
        self.searcher.changed(self)

    def _require_changeable(self, what: str) -> None:
        """Refuse to change a DBA index without the model's own vectors (saved before they were kept, imported)."""
        if self.record.dba and self.unaugmented is None:
            raise ValueError(f"this index was built with database-side augmentation (DBA {self.record.dba}) but "
                             f"does not hold the vectors before augmentation, so {what}; rebuild the index")

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the index folder (see :mod:`rankopt.search.storage`) atomically, as its next version."""
        items = {**self.items.to_json(), "level_names": list(self.level_names), "label_names": self.label_names}
        stored = storage.StoredIndex(self.embeddings, self.labels, self.fingerprint, self.similarity,
                                     self.preprocessing, self.record, items, self.items.next_id, self.faiss_index,
                                     None if self.post is None else self.post.whitening, unaugmented=self.unaugmented)
        with self.searcher.saving(self, directory):  # e.g. a Qdrant collection synced after the folder is written
            folder = storage.write(directory, stored)
            (self.record.uid, self.record.version), self.folder = storage.identity(folder), folder
        return folder

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> Index:
        """Read an index folder written by :meth:`save` (or a ``rankopt fit`` run's), validating every file."""
        directory = storage.index_folder(directory)
        stored = storage.read(directory)
        items_json = Path(directory) / stored.data / storage.ITEMS_JSON
        items = IndexItems.from_json(stored.items, stored.labels.shape[0], stored.next_id, str(items_json))
        index = cls(stored.embeddings, stored.labels, items, fingerprint=stored.fingerprint,
                    preprocessing=stored.preprocessing, similarity=stored.similarity,
                    level_names=stored.items["level_names"], label_names=stored.items.get("label_names"),
                    faiss_index=stored.faiss_index, record=stored.info,
                    post=stored_post(stored.preprocessing, stored.whitening), unaugmented=stored.unaugmented)
        index.folder = Path(directory)
        return index

    @classmethod
    @contextlib.contextmanager
    def editing(cls, directory: str | os.PathLike[str]) -> Iterator[Index]:
        """``with Index.editing(DIR) as index: index.remove(...)``: the folder's writers' lock held while the
        index is loaded, changed and saved (on leaving the block without an exception), so concurrent
        changes never lose each other's work."""
        with storage.locked(directory := storage.index_folder(directory)):
            index = cls.load(directory)
            yield index
            index.save(directory)
