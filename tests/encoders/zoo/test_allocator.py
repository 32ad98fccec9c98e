"""The allocator setting (repdiag.encoders.zoo.allocator): applied once on glibc, harmless."""

from __future__ import annotations

import platform

import torch

from repdiag.encoders.zoo import allocator


def test_keep_freed_memory_applies_on_glibc_once_and_allocation_still_works():
    first = allocator.keep_freed_memory()
    assert first == (platform.libc_ver()[0] == "glibc")
    assert allocator.keep_freed_memory() is first  # later calls answer the first
    blocks = [torch.ones(1 << 21) for _ in range(4)]  # 8 MB each: heap blocks now
    del blocks
    again = torch.ones(1 << 21)
    assert float(again.sum()) == 1 << 21


def test_without_glibc_nothing_is_set(monkeypatch):
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    assert allocator.keep_freed_memory() is False
