"""One way to name a thing (encoder source, readout, metric, objective) and one function to build it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from repdiag.core.errors import RegistryError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object table that rejects duplicate names and explains unknown ones."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REG.register("cosine")`` adds the decorated object under ``name``."""

        def add(obj: T) -> T:
            self.add(name, obj)
            return obj

        return add

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise RegistryError(f"duplicate {self.kind} name {name!r}: it is already registered")
        self._items[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self._items))}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def __len__(self) -> int:
        return len(self._items)
