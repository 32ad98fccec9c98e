"""One way to name a thing (encoder source, readout, metric, objective) and one function to build it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from repdiag.core.errors import RegistryError

T = TypeVar("T")


def defining_module(obj: object) -> str:
    """The module that defines ``obj`` (a function or class; else its type's), as in timm's
    registry, so that a listing or an error says where an entry lives."""
    return str(getattr(obj, "__module__", None) or type(obj).__module__)


class Registry(Generic[T]):
    """A name -> object table that rejects duplicate names and explains unknown ones; each entry
    records the module that defined it (:meth:`module_of`, :meth:`listing`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._modules: dict[str, str] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@REG.register("cosine")`` adds the decorated object under ``name``."""

        def add(obj: T) -> T:
            self.add(name, obj)
            return obj

        return add

    def add(self, name: str, obj: T, module: str | None = None) -> None:
        """Add ``obj`` under ``name``; ``module``: where it is defined (default: the object's)."""
        module = module or defining_module(obj)
        if name in self._items:
            raise RegistryError(
                f"duplicate {self.kind} name {name!r} (from {module}): it is already registered "
                f"by {self._modules[name]}"
            )
        self._items[name] = obj
        self._modules[name] = module

    def module_of(self, name: str) -> str:
        """The module that registered ``name``."""
        self.get(name)  # an unknown name is explained
        return self._modules[name]

    def listing(self) -> dict[str, str]:
        """Every name with the module that defines it, sorted by name."""
        return {name: self._modules[name] for name in self.names()}

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
