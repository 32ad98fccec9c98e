"""The result tables of the docs, regenerated from the run that produced them.

    python tools/doc_tables.py summary RUN [PAGE ...]   # refill PAGE's marked blocks from RUN
    python tools/doc_tables.py steps RUN                # print the steps-curve table of a
                                                   # config/ssl_steps.yaml run

``summary``: a block in a page (default docs/binding.md and README.md) between
``<!-- summary: SECTION [table N] -->`` and ``<!-- /summary -->`` is replaced by the N-th
table (1 by default) of the section headed ``## SECTION`` in ``RUN/results/summary.md``, so
that a table in the docs is the run's own table, byte for byte; ``<!-- summary[TARGET]: ...
-->`` reads ``RUN/results/TARGET/summary.md`` instead (an on-request target's own summary,
e.g. ``binding_families``); ``--target T`` refills T's blocks alone (``main``: the main
study's). A summary, section or table the run lacks is an error naming it; nothing is written
unless every block was found.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

from repdiag.binding.analysis.summary import with_interval

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "docs" / "binding.md", ROOT / "README.md")
BLOCK = re.compile(
    r"(?P<open><!-- summary(?:\[(?P<target>\w+)\])?: (?P<section>.+?)(?: table (?P<index>\d+))?"
    r" -->\n)(?P<body>.*?)(?P<close><!-- /summary -->)",
    re.DOTALL,
)


def summary_tables(summary: str) -> dict[str, list[str]]:
    """Every ``## `` section of a summary.md: its markdown tables in order, each as text."""
    sections: dict[str, list[str]] = {}
    for chunk in re.split(r"^## ", summary, flags=re.MULTILINE)[1:]:
        title, _, body = chunk.partition("\n")
        tables, current = [], []
        for line in [*body.splitlines(), ""]:
            if line.startswith("|"):
                current.append(line)
            elif current:
                tables.append("\n".join(current) + "\n")
                current = []
        sections[title.strip()] = tables
    return sections


def summary_path(run: Path, target: str | None) -> Path:
    """The summary.md a block reads: the main study's, or an on-request ``target``'s own."""
    return run / "results" / (f"{target}/summary.md" if target else "summary.md")


ALL = "all"
"""``--target`` that refills every block; the main study's blocks are ``main``."""


def refill(page: str, run: Path, only: str = ALL) -> str:
    """``page`` with every marked block replaced by its table from ``run``'s summaries; with
    ``only``, the blocks of that target alone (``main``: the main study's)."""
    loaded: dict[str | None, dict[str, list[str]]] = {}

    def table(match: re.Match) -> str:
        if only != ALL and (match["target"] or "main") != only:
            return match.group(0)
        source = summary_path(run, match["target"])
        if match["target"] not in loaded:
            if not source.is_file():
                raise SystemExit(f"{source} not found: run the target there first")
            loaded[match["target"]] = summary_tables(source.read_text())
        section, index = match["section"].strip(), int(match["index"] or 1)
        tables = loaded[match["target"]].get(section)
        if tables is None:
            sections = list(loaded[match["target"]])
            raise SystemExit(f"{source} has no section '## {section}' (sections: {sections})")
        if not 1 <= index <= len(tables):
            raise SystemExit(f"'## {section}' of {source} has {len(tables)} tables, not {index}")
        return match["open"] + tables[index - 1] + match["close"]

    return BLOCK.sub(table, page)


def refill_pages(run: Path, pages: list[Path], only: str = ALL) -> list[Path]:
    """Refill every page's blocks (of target ``only``) from ``run``; the pages that changed."""
    old = {page: page.read_text() for page in pages}
    new = {page: refill(text, run, only) for page, text in old.items()}
    changed = [page for page in pages if new[page] != old[page]]
    for page in changed:
        page.write_text(new[page])
    return changed


def steps_table(run: Path) -> str:
    """One row per zoo run of a config/ssl_steps.yaml run: steps, arrangement batches, seed,
    loss against the trivial loss, slot probe against the initialisation, binding and
    Same/Different with their intervals, final-tap JER and training wall time."""
    results = run / "results"
    models = pd.read_csv(results / "tables" / "models.csv").set_index("model")
    rows = []
    for name, model in models.iterrows():
        run = model.get("run") if isinstance(model.get("run"), str) else name
        meta_path = results / "zoo" / run / "meta.json"
        if not meta_path.exists():
            continue
        meta = json.loads(meta_path.read_text())
        learning = meta["learning"]
        arrangement = bool(meta.get("arrangement_groups")) or "_arr_" in name
        rows.append(
            {
                "run": run,
                "steps": meta["steps_trained"],
                "arrangement": "yes" if arrangement else "no",
                "seed": meta["seed"],
                "loss (trivial)": f"{learning['final_loss_mean']:.2f} "
                f"({learning['trivial_loss']:.2f})",
                "slot probe (init)": f"{learning['slot_probe_accuracy']:.2f} "
                f"({learning['slot_probe_accuracy_random_init']:.2f})",
                "binding cosine": with_interval(model, "binding_cosine"),
                "binding kNN": with_interval(model, "binding_knn"),
                "Same/Different": with_interval(model, "same_different"),
                "JER final": f"{model['jer_pr_final']:.1f}",
                "wall s": f"{meta['wall_time_s']:.0f}",
            }
        )
    table = pd.DataFrame(rows).sort_values(["arrangement", "steps", "seed"], kind="stable")
    return table.to_markdown(index=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    summary = commands.add_parser("summary", help="refill the pages' blocks from a run")
    summary.add_argument(
        "run", type=Path, help="the workflow folder whose results/ the blocks read"
    )
    summary.add_argument("pages", type=Path, nargs="*", default=list(PAGES))
    summary.add_argument(
        "--target", default=ALL, help="refill only this target's blocks (main: the main study's)"
    )
    steps = commands.add_parser("steps", help="print the steps-curve table of a run")
    steps.add_argument("run", type=Path)
    args = parser.parse_args(argv)
    if args.command == "steps":
        print(steps_table(args.run))
        return 0
    for page in refill_pages(args.run, args.pages, args.target):
        print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
