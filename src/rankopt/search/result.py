"""The result of ``Index.search``: each query's top-k items, with their ids, paths, labels, metadata and,
when the index has a calibrated threshold, whether each is a match."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

LabelNames = list[list[str]]
"""``names[c][i]``: the name of label id ``i`` at level ``c`` (column 0 finest)."""


@dataclass
class SearchResult:
    """The top-``k`` of each query: ``scores``/``rows`` ``(Q, k)`` by decreasing score (``rows`` = positions
    in the index, ``-1`` with score ``-inf``: fewer than ``k`` found, by an approximate index or a filter),
    the items' stable ``ids`` (``None`` where the row is ``-1``), ``paths``, ``labels`` ``(Q, k, L)``
    (``-1``: unknown) and ``metadata`` (one dict per result, when the index has metadata columns), the
    index's ``threshold`` (``None``: not calibrated), the queries' paths and labels (``-1``: unknown) when
    the queries were images."""

    scores: torch.Tensor
    rows: torch.Tensor
    ids: list[list[str | None]]
    paths: list[list[str | None]]
    labels: torch.Tensor
    level_names: tuple[str, ...]
    label_names: LabelNames | None = None
    metadata: list[list[dict[str, Any]]] | None = None
    threshold: float | None = None
    query_paths: list[str] | None = None
    query_labels: torch.Tensor | None = None
    note: str = ""
    """Set when ``k`` was capped to the index size or to the items a filter kept."""

    @property
    def k(self) -> int:
        return int(self.rows.shape[1])

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def matches(self) -> torch.Tensor | None:
        """``(Q, k)`` bool: ``score >= threshold`` (``None`` without a threshold)."""
        return None if self.threshold is None else (self.scores >= self.threshold) & (self.rows >= 0)

    def label_text(self, label: int, level: int = 0) -> str | int | None:
        """The name of ``label`` at ``level`` when the index has names, else the id; ``None`` for ``-1``."""
        if label < 0:
            return None
        return self.label_names[level][label] if self.label_names is not None else int(label)

    def records(self) -> list[dict[str, Any]]:
        """One JSON-able dict per query: ``{"query": path or row, "query_label": ... (when known),
        "results": [{"rank", "id", "path", "score", "label"[, "metadata"][, "match"]}, ...]}`` (labels at
        the finest level; ``"match": score >= threshold`` when the index has a threshold)."""
        # each tensor read as Python lists once: indexing it per result costs several torch calls each
        matches = self.matches
        matches = None if matches is None else matches.tolist()
        rows, scores, labels = self.rows.tolist(), self.scores.tolist(), self.labels[..., 0].tolist()
        query_labels = None if self.query_labels is None else self.query_labels[:, 0].tolist()
        out = []
        for q in range(len(self)):
            record: dict[str, Any] = {"query": self.query_paths[q] if self.query_paths is not None else q}
            if query_labels is not None and query_labels[q] >= 0:
                record["query_label"] = self.label_text(query_labels[q])
            results = []
            for i, row in enumerate(rows[q]):
                if row < 0:
                    continue
                result = {"rank": i + 1, "id": self.ids[q][i], "path": self.paths[q][i], "score": scores[q][i],
                          "label": self.label_text(labels[q][i])}
                if self.metadata is not None:
                    result["metadata"] = self.metadata[q][i]
                if matches is not None:
                    result["match"] = matches[q][i]
                results.append(result)
            record["results"] = results
            out.append(record)
        return out
