"""``rankopt fit --backbone auto`` (the default): the backbone that serves the better search, as long as the budget
holds its passes over the photos.

Measured on Caltech-101 with ``fit``'s default 10 minutes on 2 cores (``benchmarks/results/fit_backbones.md``,
``fit_scale.md``, ``fit_scale_lite2.md``): EfficientNet-Lite2 served +0.031 mAP@R on new photos of known categories
and +0.021 on new categories over MobileNetV2 (5,500 and 4,000 photos, 3 seeds), at 2.4× the time of every pass
through the network. On 24,726 photos its one pass took 63 % of the budget left, the fit ended in 530 s without
fine-tuning and still served 0.926 validation mAP@R against MobileNetV2's fine-tuned 0.907; on 49,452 photos its
pass took 103 %, the fit ended at 797 s (past the budget + 10 %) and served 0.724 against 0.763. The rule:
:data:`CANDIDATES` in order of the search they served; the first whose one pass over the photos (timed on one batch,
decoding included, on the runtime it will run on) takes at most :data:`PASS_SHARE` of the budget left is kept, the
last whatever its pass costs.
"""

from __future__ import annotations

from collections.abc import Callable

from rankopt.fit.clock import clock_text

AUTO = "auto"
"""The ``--backbone`` that chooses among :data:`CANDIDATES`."""
CANDIDATES = ("efficientnet_lite2", "mobilenet_v2")
"""Built-in ImageNet backbones, the better served search first (``benchmarks/results/fit_backbones.md``)."""
PASS_SHARE = 2 / 3
"""A candidate is kept when one pass over the photos takes at most this share of the budget left: above the 63 % at
which Lite2 ended within the budget and served the better search, below the 103 % at which it did neither."""


def candidates(backbone: str, weights: str | None) -> tuple[str, ...]:
    """The backbones to try in turn: :data:`CANDIDATES` for ``auto`` (without ``weights``: a checkpoint given names
    its own backbone), else ``backbone`` alone."""
    return CANDIDATES if backbone == AUTO and weights is None else (backbone,)


def holds(pass_s: float, left_s: float) -> bool:
    """Whether one pass of ``pass_s`` seconds is within :data:`PASS_SHARE` of the ``left_s`` seconds left."""
    return pass_s <= PASS_SHARE * left_s


def passed_over(backbone: str, pass_s: float, left_s: float) -> str:
    """Why ``auto`` went past ``backbone``, in words."""
    return (f"{backbone} passed over: one pass over the photos would take about {clock_text(pass_s)}, "
            f"{pass_s / max(left_s, 1e-9):.0%} of the {clock_text(left_s)} left (auto keeps a backbone up to "
            f"{PASS_SHARE:.0%})")


def choose(backbone: str, weights: str | None, load: Callable[[str], tuple[float, str]],
           left_s: Callable[[], float]) -> str:
    """Each of :func:`candidates` loaded in turn by ``load(name)`` (which returns its one-pass seconds and the backbone
    its checkpoint holds) until one is kept (:func:`holds`; the last whatever it costs); the words a stage line starts
    with: ``"auto chose BACKBONE (why each before it was passed over): "``, or ``""`` for a single candidate."""
    names = candidates(backbone, weights)
    passed: list[str] = []
    for name in names:
        pass_s, loaded = load(name)
        if name == names[-1] or holds(pass_s, left_s()):
            break
        passed.append(passed_over(name, pass_s, left_s()))
    if len(names) == 1:
        return ""
    return f"auto chose {loaded}" + (f" ({'; '.join(passed)}): " if passed else ": ")
