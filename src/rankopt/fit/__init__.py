"""``rankopt fit``: photos in, a validated fine-tuned model and a served index out, within a time budget.

:func:`fit` runs the stages of :mod:`rankopt.fit.run`; :class:`FitSettings` holds the budget, the backbone
and the candidates.
"""

from rankopt.fit.run import fit
from rankopt.fit.settings import FitSettings

__all__ = ["FitSettings", "fit"]
