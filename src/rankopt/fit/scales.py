"""Multi-scale embedding (ICCV'19 §5: scales 1, 1/√2, 1/2, pooled features averaged by the GeM power mean), tried
on validation when the budget allows one more pass of every photo through the whole network at those scales.

Multi-scale changes every embedding, so it is chosen with its own post-processing (whitening refitted on the
multi-scale embeddings of the training classes, DBA/αQE chosen again) and kept only when the result beats the
single-scale pipeline on validation; on Caltech-101 it lowered mAP@R (benchmarks/results/landmark_toolbox_caltech101.md).
The comparison is made with the model the single-scale scores come from: when the served model is the one retrained
on every class (validation classes included), the trial runs on the tuned model before it, and a kept multi-scale
pipeline is then embedded again with the retrained one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rankopt.data.base import RetrievalDataset
from rankopt.engine.embed_and_score import embed_dataset
from rankopt.fit.post import PostChoice, choose_for_protocols
from rankopt.fit.validation import ValidationSplit, score
from rankopt.models.multiscale import DEFAULT_SCALES, MultiScaleNet
from rankopt.models.retrieval_net import RetrievalNet

COST = sum(s * s for s in DEFAULT_SCALES)
"""Forward cost of one multi-scale embedding, in single-scale forwards (pixels: 1 + 1/2 + 1/4)."""
BUDGET_SHARE = 0.15
"""Multi-scale is tried when one pass of every photo at every scale takes at most this share of the budget."""


@dataclass
class MultiScaleTrial:
    """What trying multi-scale gave: its choice and embeddings when kept, and a note either way."""

    note: str
    choice: PostChoice | None = None
    embeddings: torch.Tensor | None = None


def estimated_seconds(photos: int, photos_per_second: float) -> float:
    return photos * COST / photos_per_second


def embed_multiscale(net: RetrievalNet, dataset: RetrievalDataset, *, device: torch.device, batch_size: int,
                     workers: int) -> torch.Tensor:
    """Every photo of ``dataset`` embedded at :data:`DEFAULT_SCALES`."""
    return embed_dataset(MultiScaleNet(net, DEFAULT_SCALES), dataset, batch_size=batch_size, device=device,
                         num_workers=workers, desc="multi-scale").embeddings


def try_multiscale(net: RetrievalNet, dataset: RetrievalDataset, split: ValidationSplit, single: dict[str, float],
                   *, steps_for: str, device: torch.device, batch_size: int, workers: int, dba: bool, decide_on: Sequence[str],
                   retrained: Callable[[], None] | None = None, time_left: Callable[[], float] = lambda: math.inf,
                   pass_s: float = 0.0) -> MultiScaleTrial:
    """Embed every photo at :data:`DEFAULT_SCALES` with ``net`` as it is (the model the single-scale scores
    ``single`` (``{protocol: mAP@R}``) come from), choose post-processing on them as for one scale (for
    ``steps_for``), and keep them when their validation mAP@R beats ``single``'s on every protocol of
    ``decide_on``. ``retrained``: loads the served model into ``net`` when it is not the one validation may score
    (it trained on the validation photos); a kept trial is then embedded again with it, when ``time_left()`` allows a
    pass of ``pass_s`` seconds, and else not served."""
    kw = {"device": device, "batch_size": batch_size, "workers": workers}
    x = embed_multiscale(net, dataset, **kw)
    xv = x[torch.as_tensor(split.rows)]
    choice = choose_for_protocols(xv, split, dba=dba)[steps_for]
    values = {p: score(xv, split, p, choice.steps(choice.fitted_whitening)).value for p in decide_on}
    said = ", ".join(f"{p} queries {values[p]:.4f} against {single[p]:.4f}" for p in decide_on)
    if any(values[p] <= single[p] for p in decide_on):
        return MultiScaleTrial(f"multi-scale tried, not kept: validation mAP@R {said} at one scale")
    note = (f"multi-scale kept: validation mAP@R {said} at one scale, with its steps chosen again on the "
            f"multi-scale embeddings: {choice.describe()}")
    if retrained is None:
        return MultiScaleTrial(note, choice, x)
    if time_left() < pass_s:
        return MultiScaleTrial(f"{note}; not served: no time left to embed the photos again with the retrained model")
    retrained()
    return MultiScaleTrial(f"{note} (compared with the model before the retraining; the photos then embedded again "
                           "with the retrained one)", choice, embed_multiscale(net, dataset, **kw))
