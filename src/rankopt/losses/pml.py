"""Any pytorch-metric-learning (PML) loss by class name: ``loss.name=pml:<ClassName>``, e.g.
``loss.name=pml:CircleLoss loss.kwargs.m=0.25``.

The keyword arguments go to the class as they are; ``num_classes`` and the embedding size (``embedding_size``,
``descriptors_dim``) come from the data and the model for the classes listed in :data:`DATA_ARGUMENTS`. Such a
loss has class weights: it takes no reference set, and its weights train with ``optim.loss_params``. The others
are used as pair losses (reference set allowed where PML's class supports ``ref_emb``). PML's own objects
(``distance``, ``reducer``, ``miner``, ...) cannot come from a config.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from rankopt.losses.baselines import PMLLoss, pml
from rankopt.losses.registry import PROXIES

if TYPE_CHECKING:
    from pytorch_metric_learning.losses import BaseMetricLossFunction

PREFIX = "pml:"

DATA_ARGUMENTS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("ArcFaceLoss", "CosFaceLoss", "LargeMarginSoftmaxLoss", "NormalizedSoftmaxLoss", "ProxyAnchorLoss",
                     "ProxyNCALoss", "SoftTripleLoss", "SphereFaceLoss", "SubCenterArcFaceLoss"),
                    ("num_classes", "embedding_size")),
    "MarginLoss": ("num_classes",),
    "P2SGradLoss": ("num_classes", "descriptors_dim"),
}
"""PML's losses with class weights -> their names for the number of classes and, when they take it, the embedding
size (PML 2.x); the others get neither."""


_BASES = ("GenericPairLoss",)
"""PML classes named ``*Loss`` that are bases for the others, not losses."""


def loss_class(class_name: str) -> type[BaseMetricLossFunction]:
    """PML's loss class ``class_name``; ``ValueError`` naming it and the known ones when there is none."""
    losses = pml()
    known = {n: c for n, c in vars(losses).items() if n.endswith("Loss") and n not in _BASES
             and isinstance(c, type) and issubclass(c, losses.BaseMetricLossFunction)}
    if class_name not in known:
        raise ValueError(f"{PREFIX}{class_name}: pytorch-metric-learning has no loss class {class_name!r}; "
                         f"its losses: {', '.join(sorted(known))}")
    return known[class_name]


def init_arguments(cls: type) -> list[str]:
    """The keyword arguments ``cls(...)`` takes: its ``__init__``'s and those its ``**kwargs`` reach up the MRO."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name not in ("self", *names)]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def data_arguments(class_name: str) -> dict[str, str]:
    """``{"num_classes": "classes", "embedding_dim": "embedding_dim"}``, those of the two that the class takes
    (:data:`DATA_ARGUMENTS`)."""
    loss_class(class_name)  # ValueError naming PML's losses
    return dict(list(PROXIES.items())[: len(DATA_ARGUMENTS.get(class_name, ()))])


def pml_loss(class_name: str, *, num_classes: int | None = None, embedding_dim: int | None = None,
             **kwargs: Any) -> PMLLoss:
    """PML's ``class_name(**kwargs)`` (with ``num_classes`` and the embedding size when it takes them) as a
    :class:`PMLLoss`; ``ValueError`` naming the class and its arguments when they do not fit."""
    cls = loss_class(class_name)
    data = dict(zip(DATA_ARGUMENTS.get(class_name, ()), (num_classes, embedding_dim)))
    if None in data.values():
        raise ValueError(f"{PREFIX}{class_name} needs {', '.join(data)} (filled in from the data and the model "
                         "by the trainer)")
    try:
        loss = cls(**data, **kwargs)
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"{PREFIX}{class_name}: keyword arguments {kwargs} do not fit ({err}); it takes "
                         f"{', '.join(n for n in init_arguments(cls) if n not in data)}") from None
    weighted = "num_classes" in data
    return PMLLoss([loss], accepts_reference=not weighted, num_classes=[num_classes] if weighted else None,
                   embedding_dim=embedding_dim if weighted else None)
