"""tools/doc_tables.py: the docs' result tables are the run's own, and every marked block of the docs
names a section that a real run's summary.md has."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO


def _tables_module():
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "tools" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = _tables_module()

SUMMARY = """# title

intro line

## First section

| a | b |
|---|---|
| 1 | 2 |

text between

| c |
|---|
| 3 |

## Second (with brackets; and more)

| d |
|---|
| 4 |
"""


def test_sections_hold_their_tables_in_order() -> None:
    sections = tables.summary_tables(SUMMARY)
    assert list(sections) == ["First section", "Second (with brackets; and more)"]
    assert sections["First section"] == [
        "| a | b |\n|---|---|\n| 1 | 2 |\n",
        "| c |\n|---|\n| 3 |\n",
    ]
    assert sections["Second (with brackets; and more)"] == ["| d |\n|---|\n| 4 |\n"]


def _run_with(tmp_path: Path, **summaries: str) -> Path:
    """A run folder whose results hold ``summary.md`` (key ``main``) and each target's own."""
    for target, text in summaries.items():
        path = tables.summary_path(tmp_path, None if target == "main" else target)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_refill_replaces_only_the_marked_blocks_each_from_its_summary(tmp_path: Path) -> None:
    run = _run_with(tmp_path, main=SUMMARY, binding_families="## Other\n\n| e |\n|---|\n| 5 |\n")
    page = (
        "before\n<!-- summary: First section table 2 -->\n| stale |\n<!-- /summary -->\n"
        "middle\n<!-- summary: Second (with brackets; and more) -->\n<!-- /summary -->\n"
        "<!-- summary[binding_families]: Other -->\n<!-- /summary -->\nafter\n"
    )
    out = tables.refill(page, run)
    assert out == (
        "before\n<!-- summary: First section table 2 -->\n| c |\n|---|\n| 3 |\n<!-- /summary -->\n"
        "middle\n<!-- summary: Second (with brackets; and more) -->\n| d |\n|---|\n| 4 |\n"
        "<!-- /summary -->\n<!-- summary[binding_families]: Other -->\n| e |\n|---|\n| 5 |\n"
        "<!-- /summary -->\nafter\n"
    )
    assert tables.refill(out, run) == out  # idempotent
    only = tables.refill(page, run, "binding_families")  # that target's blocks alone
    assert "| stale |" in only and "| e |\n|---|\n| 5 |\n" in only and "| d |" not in only


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("Missing", "has no section '## Missing'"),
        ("First section table 3", "has 2 tables, not 3"),
        ("[binding_replicate]: First section", "binding_replicate/summary.md not found"),
    ],
)
def test_a_block_the_run_lacks_is_named_and_nothing_is_written(
    tmp_path: Path, marker: str, message: str
) -> None:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "summary.md").write_text(SUMMARY)
    page = tmp_path / "page.md"
    good = "<!-- summary: First section -->\n<!-- /summary -->\n"
    marker = marker if marker.startswith("[") else f": {marker}"
    page.write_text(good + f"<!-- summary{marker} -->\n<!-- /summary -->\n")
    before = page.read_text()
    with pytest.raises(SystemExit, match=re.escape(message)):
        tables.refill_pages(tmp_path, [page])
    assert page.read_text() == before


@pytest.mark.workflow
def test_every_block_of_the_docs_is_found_in_a_real_run(
    workflow_run: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The marker titles follow the summaries' section titles (the main study's and the family
    comparison's, from the on-request run): a renamed section fails here."""
    from tests.shared_runs import build_shared, shared_root

    extras = build_shared(shared_root(tmp_path_factory.getbasetemp()), "on_request")
    families = tables.summary_path(extras, "binding_families").read_text()
    main = tables.summary_path(workflow_run, None).read_text()
    run = _run_with(tmp_path / "run", main=main, binding_families=families)
    pages = [shutil.copy(page, tmp_path / page.name) for page in tables.PAGES]
    markers = sum(len(tables.BLOCK.findall(Path(page).read_text())) for page in pages)
    assert markers >= 3
    tables.refill_pages(run, [Path(page) for page in pages])
    for page in pages:
        for match in tables.BLOCK.finditer(Path(page).read_text()):
            assert match["body"].startswith("| "), (page, match["section"])


@pytest.mark.workflow
def test_the_steps_table_has_one_row_per_zoo_run_with_its_values(workflow_run: Path) -> None:
    import json

    import pandas as pd

    lines = tables.steps_table(workflow_run).splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
            for line in lines[2:]]  # fmt: skip
    zoo = sorted(p.parent.name for p in (workflow_run / "results" / "zoo").glob("*/meta.json"))
    zoo.remove("dose")  # trained for its saved step dose-step2 (a model), not a model itself
    assert "dose-step2" in zoo
    assert sorted(row["run"] for row in rows) == zoo
    models = pd.read_csv(workflow_run / "results" / "tables" / "models.csv").set_index("model")
    for row in rows:
        meta = json.loads((workflow_run / "results" / "zoo" / row["run"] / "meta.json").read_text())
        assert int(row["steps"]) == meta["steps_trained"]
        model = models[models["run"] == row["run"]].iloc[0]  # the model that loads the run
        low, high = model["binding_cosine_ci_low"], model["binding_cosine_ci_high"]
        assert row["binding cosine"] == f"{model['binding_cosine']:.3f} [{low:.2f}, {high:.2f}]"


def test_the_change_a_parameter_example_starts_from_the_configs_value():
    """README and docs/guide.md change metrics.readouts.knn.k from config/config.yaml's value."""
    import yaml

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    k = config["metrics"]["readouts"]["knn"]["k"]
    assert f"metrics.readouts.knn.k: {k} -> {k + 1}" in (REPO / "README.md").read_text()
    assert f"changed from {k} to {k + 1}" in (REPO / "docs" / "guide.md").read_text()
