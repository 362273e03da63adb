"""One registry class for every family (losses, datasets, backbones, recipes, ...).

A config string names any registered object::

    LOSSES = Registry("loss")

    @LOSSES.register("sup_ap")
    class SupAPLoss(RankLoss): ...

    LOSSES.build("sup_ap", tau=0.01)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> factory mapping with clear errors for unknown names."""

    def __init__(self, family: str) -> None:
        self.family = family
        self._entries: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        key = name.lower()

        def decorator(factory: Callable[..., T]) -> Callable[..., T]:
            if key in self._entries and self._entries[key] is not factory:
                raise KeyError(f"{self.family} {name!r} is already registered")
            self._entries[key] = factory
            return factory

        return decorator

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._entries[name.lower()]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise KeyError(f"unknown {self.family} {name!r}; known: {known}") from None

    def build(self, name: str, /, **kwargs: Any) -> T:
        return self.get(name)(**kwargs)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
