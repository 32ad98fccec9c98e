"""What an image folder's digest costs on every workflow parse: the manifest (one ``stat`` per
file, ``folder_digest: manifest``, the default) against the content (every byte hashed,
``folder_digest: content``), side by side in one process on the same folder.

    .venv/bin/python benchmarks/digests.py [--files 2000] [--kib 100] [--rounds 3]

The folder is written once into a temporary directory (random bytes, ``--files`` files of
``--kib`` KiB, as JPEGs of natural images weigh); each digest runs ``--rounds`` times in
alternation and the best time of each counts. The page cache is warm after the first round, as
it is for a folder read on every parse: the content digest's time is then hashing, not the disk.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from repdiag.core.digests import folder_digest


def write_folder(root: Path, files: int, kib: int) -> None:
    for i in range(files):
        (root / f"{i:06d}.jpg").write_bytes(os.urandom(kib * 1024))


def best_time(function: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--kib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_folder(root, args.files, args.kib)
        manifest = best_time(lambda: folder_digest(root), args.rounds)
        content = best_time(lambda: folder_digest(root, content=True), args.rounds)
    megabytes = args.files * args.kib / 1024
    print(f"{args.files} files, {megabytes:.0f} MiB, best of {args.rounds}:")
    print(f"  manifest  {manifest * 1000:9.1f} ms")
    print(f"  content   {content * 1000:9.1f} ms  ({megabytes / content:.0f} MiB/s)")
    print(f"  content / manifest: {content / manifest:.1f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return {"manifest_s": manifest, "content_s": content, "ratio": content / manifest}


if __name__ == "__main__":
    main()
