"""The store tables of ``docs/contracts.md``, generated from the contracts the readers check, so
the page and the code cannot drift.

Each store whose readers validate dtype and dims names its module here; the module holds the
contract (``{array: (dtype, dims)}``) and ``MEANING`` (``{array: text}``). ``python -m
repdiag.contracts`` rewrites the page's generated blocks (between ``<!-- contract: NAME -->``
and ``<!-- end contract -->``); a test fails when the page is stale. Top-level (above the
studies) because it reads a study's contract and a shared layer's.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Mapping
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "contracts.md"

STORES: dict[str, tuple[str, str]] = {
    "binding.zarr": ("repdiag.binding.dataset", "CONTRACT"),
    "jacobians.zarr": ("repdiag.encoders.jacobian.store", "STORE_CONTRACT"),
}
"""Block name in the page -> (module, name of its contract); ``MEANING`` sits beside it."""

_BLOCK = re.compile(
    r"(<!-- contract: (?P<name>[\w.]+) -->\n)(?P<body>.*?)(<!-- end contract -->)", re.S
)


def table(contract: Mapping[str, tuple[str, tuple[str, ...]]], meaning: Mapping[str, str]) -> str:
    """A markdown table: one row per array, in the contract's order."""
    missing = sorted(set(contract) - set(meaning))
    if missing:
        raise ValueError(f"arrays without a MEANING entry: {missing}")
    rows = ["| array | dims | dtype | meaning |", "|---|---|---|---|"]
    for name, (dtype, dims) in contract.items():
        rows.append(f"| `{name}` | ({', '.join(dims)}) | {dtype} | {meaning[name]} |")
    return "\n".join(rows) + "\n"


def block(name: str) -> str:
    """The generated table of store block ``name`` (:data:`STORES`)."""
    module_name, attribute = STORES[name]
    module = importlib.import_module(module_name)
    return table(getattr(module, attribute), module.MEANING)


def render(page: str) -> str:
    """``page`` with every generated block replaced by its table; every store in one block."""
    seen = [match["name"] for match in _BLOCK.finditer(page)]
    if sorted(seen) != sorted(STORES):
        raise ValueError(
            f"docs/contracts.md has blocks {seen}; expected one each of {list(STORES)}"
        )
    return _BLOCK.sub(lambda m: m[1] + block(m["name"]) + m[4], page)


def main(argv: list[str] | None = None) -> int:
    """Rewrite ``docs/contracts.md`` (``--check``: exit 1 when it is stale instead)."""
    argv = sys.argv[1:] if argv is None else argv
    text = PAGE.read_text()
    fresh = render(text)
    if "--check" in argv:
        return int(fresh != text)
    PAGE.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
