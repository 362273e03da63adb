"""Named loss terms, recorded while a loss is computed (for the per-step training log).

A composite loss reports the *unweighted* value of each of its parts, e.g. ROADMAP's
``sup_ap`` and ``calibration`` terms (NeurIPS'21 Eq. 2), and a cross-batch memory its
``batch`` and ``memory`` terms. Recording costs nothing unless a :func:`recording`
block is open::

    with recording() as terms:
        loss = loss_fn(embeddings, labels)
    terms  # {"sup_ap": 0.41, "calibration": 0.12}

Inside :func:`scope("memory")`, names get the prefix ``memory/``. A term recorded twice
in one block (e.g. a loss called once per sub-batch) keeps the mean of its values.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_blocks: list[dict[str, list[float]]] = []
_prefixes: list[str] = []


@contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Open a block; on exit the yielded dict holds ``{name: mean recorded value}``."""
    values: dict[str, list[float]] = {}
    result: dict[str, float] = {}
    _blocks.append(values)
    try:
        yield result
    finally:
        _blocks.pop()
        result.update({name: sum(v) / len(v) for name, v in values.items()})


@contextmanager
def scope(name: str) -> Iterator[None]:
    """Prefix the names recorded inside with ``name/``."""
    _prefixes.append(name)
    try:
        yield
    finally:
        _prefixes.pop()


def record(name: str, value: torch.Tensor | float) -> None:
    """Record ``value`` as term ``name`` in the innermost open block (a no-op when none is open)."""
    if not _blocks:
        return
    full = "/".join([*_prefixes, name])
    number = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
    _blocks[-1].setdefault(full, []).append(number)


def term_name(module: object) -> str:
    """A loss module's term name: its class name in snake case without ``Loss``
    (``SupAPLoss`` -> ``sup_ap``, ``ProxyDGLoss`` -> ``proxy_dg``, ``HAPLoss`` -> ``hap``)."""
    name = type(module).__name__.removesuffix("Loss") or type(module).__name__
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
