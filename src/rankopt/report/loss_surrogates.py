"""The surrogate a loss puts in place of the step ``H(d)`` of the rank (``report.html``'s surrogate section):
the curves to draw and a sentence saying what they are, with the defaults read from the loss classes."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rankopt.viz import Surrogate

__all__ = ["SurrogateSpec", "surrogates_for"]

_SIGMOID_LOSSES = ("smooth_ap", "smooth_recall")
_SUPRANK_LOSSES = ("sup_ap", "roadmap", "rod_ap", "sup_recall", "rod_recall", "hap", "happier", "sup_ndcg", "rod_ndcg")
_BINNING_LOSSES = ("fastap", "softbin_ap")


@dataclass(frozen=True)
class SurrogateSpec:
    """How a loss replaces the step ``H(d)``: the curves to draw and a sentence saying what they are."""

    surrogates: list[Surrogate]
    description: str
    zoom: float | None
    y_max: float = 1.1


def _defaults(*factories: Callable[..., Any]) -> dict[str, Any]:
    """Keyword defaults of the factories' signatures (classes: every ``__init__`` of the MRO); first wins."""
    out: dict[str, Any] = {}
    for factory in factories:
        inits = [c.__dict__["__init__"] for c in factory.__mro__ if "__init__" in c.__dict__] \
            if isinstance(factory, type) else [factory]
        for init in inits:
            for p in inspect.signature(init).parameters.values():
                if p.default is not inspect.Parameter.empty:
                    out.setdefault(p.name, p.default)
    return out


def _soft_binning_step(num_bins: int, lo: float, hi: float) -> Callable[[np.ndarray], np.ndarray]:
    """Weight with which an item at ``s_j + d`` counts in the binned rank of a positive at
    ``s_j`` (``sum_m c_j(m) * sum_{m' <= m} c_k(m')``, the kernels of
    :func:`rankopt.losses.histogram_ap.soft_histograms`), averaged over ``s_j`` across one bin."""
    # torch (slow import) only here: rankopt.report reads run folders without importing it
    import torch

    from rankopt.losses.histogram_ap import soft_histograms

    width = (hi - lo) / (num_bins - 1)
    centre = hi - width * ((num_bins - 1) // 2)
    offsets = torch.linspace(0.0, width, 17, dtype=torch.float64)[:-1]

    def step(d: np.ndarray) -> np.ndarray:
        dd = torch.as_tensor(d, dtype=torch.float64)
        sj = (centre - offsets).repeat_interleave(dd.numel())
        sk = sj + dd.repeat(offsets.numel())
        scores = torch.stack([sj, sk], dim=1)
        positives = torch.tensor([[True, False]]).expand_as(scores)
        hist, pos = soft_histograms(scores, torch.ones_like(positives), positives, lo, hi, num_bins)
        weight = (pos * (hist - pos).cumsum(dim=1)).sum(dim=1)
        return weight.view(offsets.numel(), -1).mean(dim=0).numpy()

    return step


def surrogates_for(name: str, kwargs: Mapping[str, Any]) -> SurrogateSpec:
    """The surrogate of the step function used by loss ``name`` with ``kwargs``; defaults
    are read from the signatures of the loss classes (rankopt.losses)."""
    # torch and matplotlib (slow imports) only here: rankopt.report reads run folders without them
    import torch

    from rankopt import losses
    from rankopt.losses.combination import COMBINATIONS
    from rankopt.rank.surrogates import default_delta, heaviside, sup_step
    from rankopt.viz import Surrogate

    def torch_fn(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[np.ndarray], np.ndarray]:
        return lambda d: fn(torch.as_tensor(d, dtype=torch.float64)).numpy()

    factory = losses.LOSSES.get(name) if name in losses.LOSSES.names() else None
    if name in COMBINATIONS:  # its rank term's values, given flat or in loss.kwargs.<rank term>
        kwargs = {**kwargs, **COMBINATIONS[name].route(kwargs)[0]}
    if name in _SIGMOID_LOSSES:
        tau = float({**_defaults(factory), **kwargs}["tau"])
        curve = Surrogate(f"σ(d/τ), τ = {tau:g}", torch_fn(lambda d: torch.sigmoid(d / tau)))
        return SurrogateSpec([curve], f"{name} replaces H by the sigmoid σ(d/τ) in every term of the rank "
                             f"(τ = {tau:g}); its slope is non-negligible only for |d| < δ(τ) = "
                             f"{default_delta(tau):.3g}.", zoom=3 * default_delta(tau))
    if name in _SUPRANK_LOSSES:
        p = {**_defaults(losses.SupRankLoss), **kwargs}
        tau, rho, start = float(p["tau"]), float(p["rho"]), float(p["start"])
        delta = default_delta(tau) if p.get("delta") is None else float(p["delta"])
        curves = [Surrogate(f"rank⁻ (negatives): H⁻(d), τ={tau:g}, ρ={rho:g}, δ={delta:.3g}",
                            torch_fn(lambda d: sup_step(d, tau, rho, delta, start))),
                  Surrogate("rank⁺ (other positives): H(d) itself, no gradient", torch_fn(heaviside), ":")]
        return SurrogateSpec(curves, f"{name} ranks with SupRank (ROADMAP Eq. 4): the exact step for the other "
                             f"positives (rank⁺) and H⁻ for the negatives (rank⁻): a sigmoid of temperature "
                             f"τ = {tau:g} plus {start:g}·H(d) up to δ = {delta:.3g}, then a line of slope "
                             f"ρ = {rho:g}, so H⁻ ≥ H everywhere.", zoom=3 * delta, y_max=3.0)
    if name in _BINNING_LOSSES:
        p = {**_defaults(factory), **kwargs}
        bins = int(p["num_bins"]) + (1 if name == "fastap" else 0)
        lo, hi = (-1.0, 1.0) if name == "fastap" else (float(v) for v in p["score_range"])
        width = (hi - lo) / (bins - 1)
        curve = Surrogate(f"soft binning: {bins} triangular bins of width Δ = {width:.3g}",
                          _soft_binning_step(bins, lo, hi))
        return SurrogateSpec([curve], f"{name} does not rank items: it soft-assigns each score to {bins} triangular "
                             f"bins over [{lo:g}, {hi:g}] (half-width Δ = {width:.3g}) and counts the items of the "
                             "bins at or above a positive's bin. The curve is the weight with which an item counts "
                             "in a positive's rank, averaged over where the positive falls inside its bin.",
                             zoom=3 * width)
    if name == "blackbox_ap":
        margin = float({**_defaults(factory), **kwargs}["margin"])
        lam = float({**_defaults(factory), **kwargs}["lam"])
        curve = Surrogate(f"negatives: H(d + margin), margin = {margin:g}", torch_fn(lambda d: heaviside(d + margin)))
        return SurrogateSpec([curve], f"blackbox_ap keeps the exact, piecewise-constant step (on scores shifted by "
                             f"the margin {margin:g}); its gradient comes from the blackbox interpolation of the "
                             f"ranking (λ = {lam:g}), not from a smooth surrogate.", zoom=None)
    return SurrogateSpec([], f"{name} has no rank surrogate: it optimises pairwise, triplet or proxy terms on the "
                         "scores, never the step H(d) of the rank; the step alone is shown for reference.", zoom=None)
