"""The loss registry: ``LOSSES.build("sup_ap", tau=0.01)``."""

from rankopt.registry import Registry

LOSSES: Registry = Registry("loss")
