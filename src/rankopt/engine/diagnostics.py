"""Per-step training diagnostics, logged by the trainer as ``diag/<key>`` columns of ``steps.csv``.

``train.diagnostics: [name, ...]`` selects functions of :data:`DIAGNOSTICS`; every
``train.diagnostics_every`` steps each is called on the current training batch
(embeddings detached, labels ``(B,)`` or ``(B, L)``) and returns ``{key: float}``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rankopt.losses import build
from rankopt.metrics import evaluate

SURROGATES: dict[str, tuple[str, dict[str, float]]] = {
    "smooth_ap_tau0.001": ("smooth_ap", {"tau": 0.001}),
    "smooth_ap_tau0.01": ("smooth_ap", {"tau": 0.01}),
    "smooth_ap_tau0.1": ("smooth_ap", {"tau": 0.1}),
    "sup_ap": ("sup_ap", {}),
    "fastap": ("fastap", {}),
    "softbin_ap": ("softbin_ap", {}),
}
"""Surrogate name -> (loss name, kwargs) of the AP estimates compared by :func:`surrogate_ap_errors`;
each loss is ``1 - estimated mAP`` of the batch."""


@torch.no_grad()
def surrogate_ap_errors(embeddings: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """The AP approximation error of each surrogate on one batch (Smooth-AP Eq. 8, Fig. 4)::

        AP_e = |AP_pred - AP|,   AP_pred = 1 - L_surrogate(batch)

    ``AP`` is the exact batch mAP (every item a query, the rest of the batch its retrieval set,
    pessimistic ties, queries without a positive left out, as the losses do), ``L_surrogate`` each
    loss of :data:`SURROGATES` with its defaults (Smooth-AP at three temperatures, SupAP, FastAP,
    SoftBin AP). Keys: ``ap/true``, then ``ap/<surrogate>`` and ``error/<surrogate>`` for each.
    """
    x = embeddings.detach().float()
    true_ap = evaluate(x, labels, metrics=["map"]).metrics["map"]
    out = {"ap/true": true_ap}
    for name, (loss, kwargs) in SURROGATES.items():
        estimate = 1.0 - float(build(loss, **kwargs)(x, labels))
        out[f"ap/{name}"] = estimate
        out[f"error/{name}"] = abs(estimate - true_ap)
    return out


DIAGNOSTICS: dict[str, Callable[[torch.Tensor, torch.Tensor], dict[str, float]]] = {
    "surrogate_ap": surrogate_ap_errors,
}
"""``train.diagnostics`` name -> function ``(embeddings, labels) -> {key: value}``."""
