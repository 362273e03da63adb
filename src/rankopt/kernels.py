"""One switch between the compiled kernels (numba, CPU) and the torch reference paths.

Every computation with both paths (the rank sums and step counts of :mod:`rankopt.rank.surrogates`, the calibration
hinges of :mod:`rankopt.losses.calibration`, the tiled evaluation of :mod:`rankopt.metrics.evaluation`) takes a
``method`` in :data:`METHODS` and asks :func:`use_compiled`: ``"compiled"`` runs the kernels or refuses what they
cannot run, ``"reference"`` runs torch, ``"auto"`` follows the process-wide default (:func:`set_kernels`,
:func:`using`), itself ``"auto"`` unless set: the kernels wherever they apply and the work reaches the caller's
threshold. The limits of the kernels are the named constants below.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

METHODS = ("auto", "compiled", "reference")
"""The one set of names of :func:`use_compiled`."""
ALIASES = {"torch": "reference", "chunked": "reference", "tiled": "compiled"}
"""Earlier names, still accepted: ``"torch"`` (losses, rank sums) and ``"chunked"``/``"tiled"`` (evaluation)."""

LEVEL_BITS = 8
"""Bits of a level in a key of the compiled step walk (:mod:`rankopt.rank._step_kernels`)."""
MAX_LEVELS = 1 << LEVEL_BITS
"""Relevance levels the compiled step walk takes (fewer than this)."""
MAX_COLUMNS = 1 << (32 - LEVEL_BITS)
"""Pivots per row the compiled step walk takes (fewer than this): column and level share the low 32 bits of a key."""
TILED_MIN_SCORES = 2**27
"""``"auto"`` evaluation: the tiled kernels from this many query-reference pairs (about 11.6k x 11.6k)."""

_default = "auto"


def check(method: str) -> str:
    """``method``'s name in :data:`METHODS` (aliases mapped); an unknown name raises ``ValueError``."""
    name = ALIASES.get(method, method)
    if name not in METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)} (or {', '.join(ALIASES)})")
    return name


def set_kernels(method: str) -> None:
    """Set what ``method="auto"`` means process-wide: ``"auto"`` (the rule), ``"compiled"`` or ``"reference"``."""
    global _default
    _default = check(method)


@contextmanager
def using(method: str) -> Iterator[None]:
    """:func:`set_kernels` for the duration of a ``with`` block."""
    previous = _default
    set_kernels(method)
    try:
        yield
    finally:
        set_kernels(previous)


def use_compiled(method: str, missing: Callable[[], Sequence[str]], work: int = 0, min_work: int = 0) -> bool:
    """Whether ``method`` runs the compiled kernels. ``missing()`` lists what the kernels lack for this call (empty:
    they apply; only called when the kernels may run); ``"compiled"`` refuses a call they cannot serve, ``"auto"``
    takes them where they apply and ``work >= min_work``."""
    name = check(method)
    if name == "auto":
        name = _default
    if name == "reference":
        return False
    reasons = missing()
    if name == "compiled" and reasons:
        raise ValueError(f"method={method!r} needs {', '.join(reasons)}; use method='auto' or 'reference'")
    return not reasons and (name == "compiled" or work >= min_work)
