"""``rankopt fit``: photos in, a validated fine-tuned model and a served index out, within a time budget.

:func:`fit` runs the stages of :mod:`rankopt.fit.run`; :class:`FitSettings` holds the budget, the backbone
and the candidates.
"""

from typing import TYPE_CHECKING, Any

from rankopt.fit.settings import FitSettings

if TYPE_CHECKING:
    from rankopt.fit.run import fit

__all__ = ["FitSettings", "fit"]


def __getattr__(name: str) -> Any:
    """:func:`fit` imported at first use: the command line reads :class:`FitSettings`' defaults without loading the
    training stack."""
    if name != "fit":
        raise AttributeError(f"module 'rankopt.fit' has no attribute {name!r}")
    from rankopt.fit.run import fit

    return fit
