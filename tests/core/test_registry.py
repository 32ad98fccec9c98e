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
