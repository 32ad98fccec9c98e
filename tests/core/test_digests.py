"""Digests of files and folders read by jobs (repdiag.core.digests), against hashlib directly."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from repdiag.core import digests as module
from repdiag.core.digests import MISSING, digests, file_sha256, folder_digest, folder_manifest


def test_a_file_digest_is_its_sha256_and_is_cached_by_size_and_mtime(tmp_path: Path) -> None:
    path, cache = tmp_path / "w.safetensors", tmp_path / "cache" / "digests.json"
    path.write_bytes(b"abc" * 1000)
    expected = "sha256:" + hashlib.sha256(b"abc" * 1000).hexdigest()
    module._SHA_CACHE.clear()
    assert file_sha256(path, cache) == expected
    assert list(json.loads(cache.read_text()).values()) == [expected]
    # same size, same mtime, same inode: the cached digest is trusted (this is the stated cost)
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.write(b"x")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    module._SHA_CACHE.clear()
    assert file_sha256(path, cache) == expected  # read from the JSON cache, not the file
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # touched: read again
    changed = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert file_sha256(path, cache) == changed != expected


def test_a_folder_digest_is_a_manifest_of_names_sizes_and_mtimes(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.png").write_bytes(b"1")
    (tmp_path / "d" / "sub" / "b.png").write_bytes(b"22")
    (tmp_path / "d" / ".DS_Store").write_bytes(b"hidden")
    (tmp_path / "outside.png").write_bytes(b"333")
    (tmp_path / "d" / "link.png").symlink_to(tmp_path / "outside.png")
    manifest = folder_manifest(tmp_path / "d")
    assert [(name, size) for name, size, _ in manifest] == [("a.png", 1), ("sub/b.png", 2)]
    sha = hashlib.sha256()
    for name, size, mtime in manifest:
        sha.update(f"{name}\0{size}\0{mtime}\n".encode())
    assert folder_digest(tmp_path / "d") == f"manifest:{sha.hexdigest()}"
    before = folder_digest(tmp_path / "d")
    (tmp_path / "d" / "sub" / "b.png").write_bytes(b"23")  # same size, new mtime
    os.utime(tmp_path / "d" / "sub" / "b.png", ns=(1, 1))
    assert folder_digest(tmp_path / "d") != before


def test_missing_paths_and_bad_kinds(tmp_path: Path) -> None:
    assert file_sha256(tmp_path / "nope") == MISSING
    assert folder_digest(tmp_path / "nope") == MISSING
    (tmp_path / "f").write_bytes(b"")
    assert digests([("a", tmp_path / "f", "file"), ("b", tmp_path, "dir")])["a"] == (
        "sha256:" + hashlib.sha256(b"").hexdigest()
    )
    with pytest.raises(ValueError, match="x: kind 'link'"):
        digests([("x", tmp_path, "link")])
