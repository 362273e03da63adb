"""SupRank losses: the shared rank machinery and Sup-AP (ROADMAP Eq. 5 = TPAMI Eq. 11)."""

from __future__ import annotations

import torch

from rankopt.losses.rank_loss import RankLoss, RetrievalSet
from rankopt.losses.registry import LOSSES
from rankopt.rank.surrogates import default_delta
from rankopt.rank.suprank import SupRanks


def _ranks_field(name: str) -> property:
    return property(lambda self: getattr(self.ranks, name), doc=f"``{name}`` of :attr:`SupRankLoss.ranks`.")


class SupRankLoss(RankLoss):
    """Base of the SupRank losses: ``rank(k) = rank^+(k) + rank_s^-(k)`` with the exact step in
    ``rank^+`` (no gradient) and ``H^-`` (TPAMI Eq. 4, :func:`~rankopt.rank.surrogates.sup_step`)
    in ``rank_s^-`` (TPAMI Eq. 5), computed by :attr:`ranks` (:class:`~rankopt.rank.suprank.SupRanks`, which also
    sizes the chunks). Defaults: ``tau = 0.01``, ``rho = 100``, ``delta = tau ln((1 - eps) / eps)`` with
    ``eps = 1e-2`` (~0.0459), ``start = 0.5``; ``step_counts`` and ``method``: see ``SupRanks``.
    """

    tau, rho, delta = _ranks_field("tau"), _ranks_field("rho"), _ranks_field("delta")
    start, step_counts, method = _ranks_field("start"), _ranks_field("step_counts"), _ranks_field("method")

    def __init__(
        self, *, tau: float = 0.01, rho: float = 100.0, delta: float | None = None, start: float = 0.5,
        step_counts: str = "sorted", method: str = "auto", **kwargs
    ) -> None:
        super().__init__(**kwargs)
        delta = default_delta(tau) if delta is None else float(delta)
        self.ranks = SupRanks(float(tau), float(rho), delta, float(start), step_counts, method)

    def elements_per_row(self, batch: RetrievalSet) -> int:
        """``"pairwise"``: :class:`RankLoss`'s; ``"sorted"``: :meth:`SupRanks.elements_per_row`."""
        if self.step_counts == "pairwise":
            return super().elements_per_row(batch)
        return self.ranks.elements_per_row(batch.scores, batch.levels, batch.valid, batch.num_levels)

    def extra_repr(self) -> str:
        steps = "" if self.step_counts == "sorted" else f", step_counts={self.step_counts!r}"
        steps += "" if self.method == "auto" else f", method={self.method!r}"
        return (f"tau={self.tau}, rho={self.rho}, delta={self.delta:.4g}, "
                f"start={self.start}{steps}, ") + super().extra_repr()


@LOSSES.register("sup_ap")
class SupAPLoss(SupRankLoss):
    """Sup-AP (ROADMAP Eq. 5, TPAMI Eq. 11)::

        L = 1 - 1/M sum_i 1/|P_i| sum_{k in P_i} rank^+(k) / (rank^+(k) + rank_s^-(k))

    an upper bound of ``1 - AP`` (``H^- >= H``). Uses label column 0.
    """

    accepts_relevance = True

    def query_terms(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,
                    num_levels: int) -> torch.Tensor:
        pivots, rank_plus, rank_minus = self.ranks(scores, levels, valid, num_levels)
        # padding divides by 1: a 0 / 0 there, even unselected by a where, would give a NaN gradient
        ratio = rank_plus * pivots.present / torch.where(pivots.present, rank_plus + rank_minus,
                                                         torch.ones_like(rank_minus))
        return 1.0 - ratio.sum(1) / pivots.present.sum(1).clamp(min=1)
