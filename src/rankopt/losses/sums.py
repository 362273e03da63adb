"""Weighted sums of losses, as the papers build them: ``L = Σ_t w_t L_t``, e.g. Smooth-AP appended to ArcFace
(Smooth-AP §6.3, Table 4: ``loss.name=arcface+smooth_ap``).

Two spellings of the same terms (:func:`loss_terms`), each term's keyword arguments in its own map:

* ``loss.name=arcface+smooth_ap``: weights 1, ``loss.kwargs`` keyed by term name
  (``loss.kwargs.smooth_ap.tau=0.01``);
* ``loss.terms=[{name: arcface, weight: 1.0, kwargs: {margin: 28.6}}, {name: smooth_ap, weight: 0.5}]``, with
  ``loss.name`` the terms' names joined by ``+`` and ``loss.kwargs`` empty.

A ROD combination (:mod:`rankopt.losses.combination`) keys its two terms' kwargs the same way (:func:`term_maps`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rankopt.losses.terms import record, scope
from rankopt.rank.relevance_input import require_class_labels

SEPARATOR = "+"


@dataclass(frozen=True)
class LossTerm:
    """One term of a sum: ``weight · build(name, **kwargs)``."""

    name: str
    weight: float = 1.0
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def loss_terms(name: str, kwargs: Mapping[str, Any], listed: Sequence[Mapping[str, Any]] = ()) -> list[LossTerm]:
    """The terms of a loss config (``loss.name``, ``loss.kwargs``, ``loss.terms``; module docstring): one term
    ``(name, 1, kwargs)`` for a single loss. ``ValueError`` when the spellings disagree or a name repeats."""
    if listed:
        found = [LossTerm(str(t.get("name") or ""), float(t.get("weight", 1.0)), dict(t.get("kwargs") or {}))
                 for t in listed]
        joined = SEPARATOR.join(t.name for t in found)
        if not all(t.name for t in found) or name != joined or kwargs:
            raise ValueError(f"loss.terms: every term needs a name, loss.name must be their sum {joined!r} (got "
                             f"{name!r}) and loss.kwargs empty (got {dict(kwargs)}): each term's kwargs go in its "
                             "own 'kwargs' map")
    elif SEPARATOR in name:
        names = [part.strip() for part in name.split(SEPARATOR)]
        maps, stray = term_maps(names, kwargs)
        if stray or not all(names):
            raise ValueError(f"loss {name!r}: loss.kwargs of a sum maps each term's name ({', '.join(names)}) to its "
                             f"own kwargs, e.g. loss.kwargs.{names[-1]}.<arg>=<value>; got {sorted(stray)}")
        found = [LossTerm(n, 1.0, maps[n]) for n in names]
    else:
        return [LossTerm(name, 1.0, dict(kwargs))]
    names = [t.name for t in found]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"loss {name!r}: term(s) {repeated} given twice; give each term once, with its weight")
    return found


def term_maps(names: Sequence[str], kwargs: Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Split ``kwargs`` into each term's own map (``kwargs[<term name>]``, a mapping; ``{}`` when absent) and
    the other keys: ``loss.kwargs.<term>.<arg>=<value>`` for the terms of a sum and of a ROD combination."""
    own = {k for k, v in kwargs.items() if k in names and isinstance(v, Mapping)}
    return {n: dict(kwargs[n]) if n in own else {} for n in names}, {k: v for k, v in kwargs.items() if k not in own}


class LossSum(nn.Module):
    """``Σ_t w_t L_t(embeddings, labels[, reference])``: each term's unweighted value is recorded under its name
    (:mod:`rankopt.losses.terms`; a term's own terms under ``<name>/``). The reference set (memory bank, other
    ranks) goes to the terms that accept one (``accepts_reference``, then true of the sum); the others see the
    batch. Learnable parameters (class weights, proxies) are reached through ``parameters()``."""

    def __init__(self, named: Sequence[tuple[str, float, nn.Module]]) -> None:
        super().__init__()
        if not named:
            raise ValueError("a sum of losses needs at least one term")
        self.names = [name for name, _, _ in named]
        self.weights = [float(weight) for _, weight, _ in named]
        self.terms = nn.ModuleList([loss for _, _, loss in named])

    @property
    def accepts_reference(self) -> bool:
        return any(getattr(loss, "accepts_reference", False) for loss in self.terms)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_embeddings: torch.Tensor | None = None,
                ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        require_class_labels(labels, "a sum of losses")
        total = embeddings.new_zeros((), dtype=torch.promote_types(embeddings.dtype, torch.float32))
        for name, weight, loss in zip(self.names, self.weights, self.terms):
            with scope(name):
                if ref_embeddings is not None and getattr(loss, "accepts_reference", False):
                    value = loss(embeddings, labels, ref_embeddings, ref_labels)
                else:
                    value = loss(embeddings, labels)
            record(name, value)
            total = total + weight * value
        return total

    def extra_repr(self) -> str:
        return " + ".join(f"{w:g}·{n}" for n, w in zip(self.names, self.weights))
