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
    # the link is what a reader reads (its target's size), recorded with its target
    assert [(name, size, target) for name, size, _, target in manifest] == [
        ("a.png", 1, ""), ("link.png", 3, str(tmp_path / "outside.png")), ("sub/b.png", 2, ""),
    ]  # fmt: skip
    sha = hashlib.sha256()
    for name, size, mtime, target in manifest:
        sha.update(f"{name}\0{size}\0{mtime}\0{target}\n".encode())
    assert folder_digest(tmp_path / "d") == f"manifest:{sha.hexdigest()}"
    before = folder_digest(tmp_path / "d")
    (tmp_path / "d" / "sub" / "b.png").write_bytes(b"23")  # same size, new mtime
    os.utime(tmp_path / "d" / "sub" / "b.png", ns=(1, 1))
    assert folder_digest(tmp_path / "d") != before


def test_the_manifest_lists_exactly_what_the_image_readers_read(tmp_path: Path) -> None:
    """Before: a rewritten hidden image, or a symlinked image in a subfolder, was read but not
    in the manifest, so nothing reran. Now one listing serves both."""
    from repdiag.common.images import list_images

    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.png").write_bytes(b"1")
    (folder / ".hidden.png").write_bytes(b"2")  # left out of both (AppleDouble files: ._x.png)
    (tmp_path / "outside.png").write_bytes(b"3")
    (folder / "sub" / "link.png").symlink_to(tmp_path / "outside.png")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.png").write_bytes(b"4")
    (folder / "linked_dir").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    read = [p.relative_to(folder).as_posix() for p in list_images(folder, (".png",))]
    assert read == [entry[0] for entry in folder_manifest(folder)] == ["a.png", "sub/link.png"]
    before = folder_digest(folder)
    (tmp_path / "outside.png").write_bytes(b"33")  # the linked image rewritten: a change
    assert folder_digest(folder) != before


def test_missing_paths_and_bad_kinds(tmp_path: Path) -> None:
    assert file_sha256(tmp_path / "nope") == MISSING
    assert folder_digest(tmp_path / "nope") == MISSING
    (tmp_path / "f").write_bytes(b"")
    assert digests([("a", tmp_path / "f", "file"), ("b", tmp_path, "dir")])["a"] == (
        "sha256:" + hashlib.sha256(b"").hexdigest()
    )
    with pytest.raises(ValueError, match="x: kind 'link'"):
        digests([("x", tmp_path, "link")])


def test_a_content_digest_sees_a_rewrite_that_keeps_size_and_time(tmp_path: Path) -> None:
    """``folder_digest: content``: a file rewritten with other bytes of the same size, its time
    put back (as ``cp -p`` or ``rsync -t`` leave it), changes the content digest and not the
    manifest; the content digest is the hash of names, link targets and bytes."""
    folder = tmp_path / "images"
    folder.mkdir()
    image = folder / "a.png"
    image.write_bytes(b"x" * 100)
    (folder / ".hidden.png").write_bytes(b"not listed")
    stat = image.stat()
    manifest, content = folder_digest(folder), folder_digest(folder, content=True)
    expected = hashlib.sha256(b"a.png\0\0" + b"x" * 100 + b"\n").hexdigest()
    assert content == f"content:{expected}" and manifest.startswith("manifest:")
    image.write_bytes(b"y" * 100)
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert folder_digest(folder) == manifest  # the manifest trusts the time
    assert folder_digest(folder, content=True) != content
    assert digests([("k", folder, "dir-content")]) == {"k": folder_digest(folder, content=True)}
