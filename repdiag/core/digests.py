"""Digests of the files and folders a job reads that are not Snakemake inputs of their own.

Snakemake reruns a job when an input is newer than its outputs or a param changed. A weights file
or an image folder read by a job but not declared would change unseen, so the rules put a digest
of each in the job's params (and the job records it in its store's provenance):

* a **file** (weights: ``pretrained:`` files, checkpoint and hub ``weights:``): the SHA-256 of its
  content, cached by (path, size, mtime_ns, inode) in memory and in an optional JSON file, so a
  large file is read again only when its size or time changed. A file rewritten with new content
  reruns its jobs; a file only touched (same bytes, new mtime) is read again and reruns nothing.
* a **folder** (image sets, probe folders, CIFAR's ``train/``/``test/``, SugarCrepe's images, a
  hub repository): the SHA-256 of its manifest, one ``relative name, size, mtime_ns`` line per
  file at any depth, in name order. Cheap for thousands of images (one ``stat`` each, no reads);
  a file added, removed, renamed, resized or rewritten reruns its jobs, and so does a file only
  touched (its mtime is in the manifest): hashing every image on every parse would cost more
  than the rare rerun. Where times cannot be trusted (a copy that keeps them, coarse times),
  ``folder_digest: content`` hashes every listed file's bytes instead, on every parse
  (``benchmarks/digests.py`` measures the two side by side).

A path that does not exist gets the digest ``missing``: the job itself reports it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

_SHA_CACHE: dict[tuple[str, int, int, int], str] = {}

MISSING = "missing"


def _stat_key(path: Path) -> tuple[str, int, int, int]:
    stat = path.stat()
    return (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino)


def _read_cache(cache: Path | None) -> dict[str, str]:
    if cache is None:
        return {}
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def _write_cache(cache: Path, entries: dict[str, str]) -> None:
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(entries))
        partial.replace(cache)
    except OSError:  # an unwritable cache only costs the next parse a read of the file
        pass


def file_sha256(path: str | Path, cache: str | Path | None = None) -> str:
    """``sha256:<hex>`` of the content of ``path``, cached by (path, size, mtime_ns, inode).

    ``cache``: a JSON file keeping the digests between processes (each Snakemake call parses the
    workflow again); without it, only this process remembers them.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        return MISSING
    key = _stat_key(path)
    if key in _SHA_CACHE:
        return _SHA_CACHE[key]
    cache = None if cache is None else Path(cache)
    stored = _read_cache(cache)
    text_key = json.dumps(key)
    if text_key not in stored:
        sha = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
        stored[text_key] = f"sha256:{sha.hexdigest()}"
        if cache is not None:
            _write_cache(cache, stored)
    _SHA_CACHE[key] = stored[text_key]
    return stored[text_key]


def folder_entries(folder: str | Path, recursive: bool = True) -> list[Path]:
    """What a folder reader reads under ``folder``, sorted: every entry that is not a folder
    (files, links to files, FIFOs: the reader refuses what it cannot read, naming it), and with
    ``recursive`` those of its subfolders. Hidden entries (``.DS_Store``, ``._x.png``,
    ``.ipynb_checkpoints``) are left out, and links to folders are not descended. The one listing
    of both the readers (:func:`repdiag.common.images.list_images`) and the manifest, so the
    manifest covers exactly what they read."""
    root = Path(folder).expanduser()
    found: list[Path] = []
    stack = [root]
    while stack:
        current = stack.pop()
        with os.scandir(current) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    if recursive:
                        stack.append(Path(entry.path))
                elif not entry.is_dir():  # a link to a folder is neither listed nor descended
                    found.append(Path(entry.path))
    return sorted(found)


def folder_manifest(folder: str | Path) -> list[tuple[str, int, int, str]]:
    """``(relative name, size, mtime_ns, link target)`` of every entry of
    :func:`folder_entries`: a link's size and time are its target's (what the reader reads),
    and its target is recorded (a link pointed elsewhere changes the manifest)."""
    root = Path(folder).expanduser()
    found = []
    for path in folder_entries(root):
        try:
            info = path.stat()
        except OSError:  # a dangling link: listed, the reader names it
            info = path.lstat()
        target = os.readlink(path) if path.is_symlink() else ""
        found.append((path.relative_to(root).as_posix(), info.st_size, info.st_mtime_ns, target))
    return found


def folder_digest(folder: str | Path, content: bool = False) -> str:
    """``manifest:<sha256 hex>`` of :func:`folder_manifest` (``missing`` when not a folder), or
    with ``content``, ``content:<sha256 hex>`` of every listed file's name, link target and bytes
    (read in full, uncached: nothing of a file's metadata is trusted)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        return MISSING
    sha = hashlib.sha256()
    for name, size, mtime_ns, target in folder_manifest(root):
        if not content:
            sha.update(f"{name}\0{size}\0{mtime_ns}\0{target}\n".encode())
            continue
        sha.update(f"{name}\0{target}\0".encode())
        try:
            with open(root / name, "rb") as stream:
                while block := stream.read(1 << 20):
                    sha.update(block)
        except OSError as err:  # a dangling link or a FIFO: its name stands, the reader refuses it
            sha.update(f"unreadable {type(err).__name__}".encode())
        sha.update(b"\n")
    return f"{'content' if content else 'manifest'}:{sha.hexdigest()}"


def digests(
    files: Iterable[tuple[str, str | Path, str]], cache: str | Path | None = None
) -> dict[str, str]:
    """``{dotted key: digest}`` of ``(dotted key, path, "file"|"dir"|"dir-content")`` triples: a
    file's content (:func:`file_sha256`), a folder's manifest or its files' content
    (:func:`folder_digest`)."""
    out = {}
    for where, path, kind in files:
        if kind in ("dir", "dir-content"):
            out[where] = folder_digest(path, content=kind == "dir-content")
        elif kind == "file":
            out[where] = file_sha256(path, cache)
        else:
            raise ValueError(f"{where}: kind {kind!r} is not 'file', 'dir' or 'dir-content'")
    return out
