from __future__ import annotations

import pytest

from repdiag.core.errors import RegistryError
from repdiag.core.registry import Registry


def test_register_get_and_list():
    reg: Registry[int] = Registry("metric")

    @reg.register("b")
    def b() -> int:
        return 2

    reg.add("a", 1)
    assert reg.get("a") == 1 and reg.get("b")() == 2
    assert reg.names() == ["a", "b"] and list(reg) == ["a", "b"] and len(reg) == 2 and "a" in reg


def test_duplicates_are_rejected_and_unknown_names_listed():
    reg: Registry[int] = Registry("readout")
    reg.add("cosine", 1)
    with pytest.raises(RegistryError, match="duplicate readout name 'cosine'"):
        reg.add("cosine", 2)
    assert reg.get("cosine") == 1
    with pytest.raises(RegistryError, match="unknown readout 'cosin'; choose one of: cosine"):
        reg.get("cosin")


def test_entries_record_the_module_that_defines_them():
    reg: Registry[object] = Registry("objective")

    @reg.register("local")
    def local() -> None: ...

    reg.add("from_elsewhere", pytest.raises)  # a function of another module
    reg.add("named", 3, module="my_package.objectives")
    assert reg.module_of("local") == __name__
    assert reg.module_of("from_elsewhere") == pytest.raises.__module__
    assert reg.listing() == {
        "from_elsewhere": pytest.raises.__module__,
        "local": __name__,
        "named": "my_package.objectives",
    }
    with pytest.raises(
        RegistryError, match=rf"'local' \(from other.mod\).*registered by {__name__}"
    ):
        reg.add("local", 4, module="other.mod")
    with pytest.raises(RegistryError, match="unknown objective 'nope'"):
        reg.module_of("nope")


def test_every_registry_of_the_package_knows_where_its_entries_live():
    from repdiag.binding.metrics.readouts import READOUTS
    from repdiag.encoders.zoo.objectives.base import OBJECTIVES

    for registry in (READOUTS, OBJECTIVES):
        assert registry.listing() and all(
            module.startswith("repdiag.") for module in registry.listing().values()
        )
