"""The loss registry: ``LOSSES.build("sup_ap", tau=0.01)``, and each loss's declared data arguments.

A loss whose constructor takes arguments from the data and the model (proxies, class weights) declares them
where it is registered, ``@register("arcface", data=PROXIES)``; :func:`rankopt.losses.data_arguments` reads
the declaration, nothing is read from signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from rankopt.registries import Registry

LOSSES: Registry = Registry("loss")

PROXIES: Mapping[str, str] = MappingProxyType({"num_classes": "classes", "embedding_dim": "embedding_dim"})
"""One proxy (class weight) per finest-level class: ``num_classes`` and ``embedding_dim`` from the data and model."""

PER_LEVEL_PROXIES: Mapping[str, str] = MappingProxyType({"num_classes": "classes_per_level",
                                                         "embedding_dim": "embedding_dim"})
"""Proxies for every level (the Σ-over-levels losses): ``num_classes`` holds one count per label column."""

DATA_ARGUMENTS: dict[str, Mapping[str, str]] = {}
"""Registered name -> its data arguments (argument -> source), for the losses that declare some."""


def register(name: str, *, data: Mapping[str, str] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``LOSSES.register(name)``, declaring the constructor arguments that come from the data and the model:
    argument -> source, ``"classes"``, ``"classes_per_level"`` or ``"embedding_dim"`` (:data:`PROXIES`)."""
    if data:
        DATA_ARGUMENTS[name.lower()] = MappingProxyType(dict(data))
    return LOSSES.register(name)
