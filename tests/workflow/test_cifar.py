"""The CIFAR-10 SimCLR branch on config/cifar_smoke.yaml and a generated CIFAR-format fixture.

config/test.yaml keeps the branch off (the session workflow cannot generate data first), so this
module runs its own small workflow copy: the fixture is written, then `snakemake cifar`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from repdiag.cifar.data import write_fixture
from repdiag.cifar.study import run_names
from repdiag.core.config import fill_defaults
from tests.conftest import copy_workflow, snakemake
from tests.planning import PlanError, plan, wildcard_values

# one worker for the module: its module-scoped fixture is expensive (tests/shared_runs.py)
pytestmark = [pytest.mark.workflow, pytest.mark.xdist_group("workflow/test_cifar")]
# --configfile replaces config/config.yaml; several files are merged in order (the smoke file is an overlay)
SMOKE = ("--configfile", "config/test.yaml", "config/cifar_smoke.yaml")


def _smoke_cifar(workdir: Path) -> dict:
    config = yaml.safe_load((workdir / "config" / "cifar_smoke.yaml").read_text())
    return fill_defaults(config)["cifar"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = copy_workflow(tmp_path_factory.mktemp("cifar"))
    write_fixture(workdir / _smoke_cifar(workdir)["data_dir"], n_train_per_class=8)
    snakemake(workdir, "cifar", *SMOKE)
    return workdir


def test_fixture_run_trains_probes_and_writes_the_table(smoke_run: Path) -> None:
    cifar = _smoke_cifar(smoke_run)
    names = run_names(cifar)
    assert len(names) == 4  # 2 architectures (a gap) x 2 regimes (its change), the smoke size
    for name in names:
        record = json.loads((smoke_run / "results" / "cifar" / f"{name}.json").read_text())
        assert record["run"] == name and record["data"]["layout"] == "pickle"
        assert (record["data"]["n_train"], record["data"]["n_test"]) == (64, 40)
        assert record["train"]["steps"] == 64 // 32 and record["train"]["device"] == "cpu"
        assert np.isfinite(record["train"]["final_loss"])
        assert 0.0 <= record["accuracy"] <= 1.0 and record["probe"]["chance"] == 0.1
        assert record["model"]["feature_dim"] == cifar["feature_dim"]
        curve = pd.read_csv(smoke_run / "results" / "cifar" / f"{name}.curve.csv")
        assert list(curve.columns) == ["step", "loss", "lr"] and list(curve["step"]) == [1, 2]
        assert (smoke_run / "logs" / "benchmarks" / "cifar_simclr" / f"{name}.tsv").exists()
    runs = pd.read_csv(smoke_run / "results" / "tables" / "cifar_simclr_runs.csv")
    assert sorted(runs["run"]) == sorted(names)
    table = pd.read_csv(smoke_run / "results" / "tables" / "cifar_simclr.csv")
    assert table["kind"].value_counts().to_dict() == {
        "accuracy": 4,
        "gap": 2,
        "spread": 2,
    }  # 1 architecture pair, 2 regimes
    acc = table[table["kind"] == "accuracy"].set_index(["regime", "architecture"])
    for _, run in runs.iterrows():
        assert acc.loc[(run["regime"], run["architecture"]), "mean"] == pytest.approx(
            run["accuracy"], abs=1e-6
        )
    gap = table[table["kind"] == "gap"].set_index(["regime", "architecture"])
    expected = acc.loc[("no_crop", "resnet18"), "mean"] - acc.loc[("no_crop", "mlp"), "mean"]
    assert gap.loc[("no_crop", "resnet18 - mlp"), "mean"] == pytest.approx(expected, abs=1e-5)
    # the interaction: the gap's change from the reference regime (all, the first of the regimes)
    delta = (
        gap.loc[("no_crop", "resnet18 - mlp"), "mean"] - gap.loc[("all", "resnet18 - mlp"), "mean"]
    )
    assert gap.loc[("no_crop", "resnet18 - mlp"), "delta_vs_reference"] == pytest.approx(
        delta, abs=1e-5
    )
    assert gap.loc[("all", "resnet18 - mlp"), "delta_vs_reference"] == pytest.approx(0.0, abs=1e-9)
    for suffix in ("png", "pdf"):
        assert (smoke_run / "results" / "figures" / f"cifar_simclr.{suffix}").stat().st_size > 0


def test_only_the_regimes_using_a_changed_key_rerun(smoke_run: Path) -> None:
    path = smoke_run / "config" / "cifar_smoke.yaml"
    original = path.read_text()
    config = yaml.safe_load(original)
    try:
        config["cifar"]["augment"] = {"flip_p": 0.25}  # a geometric key: all, not no_crop
        path.write_text(yaml.safe_dump(config, sort_keys=True))  # key order is not a change
        runs = set(
            wildcard_values(plan(smoke_run, "cifar", configfiles=SMOKE[1:]), "cifar_simclr", "run")
        )
    finally:
        path.write_text(original)
    assert runs == {f"{a}__all__s0" for a in ("resnet18", "mlp")}


def test_missing_data_directory_fails_before_any_job(tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "config" / "missing.yaml").write_text(
        "cifar: {enabled: true, data_dir: no/such/dir}\n"
    )
    with pytest.raises(PlanError) as refused:
        plan(workdir, "cifar", configfiles=["config/test.yaml", "config/missing.yaml"])
    text = str(refused.value)
    assert "CIFAR-10 was not found in no/such/dir (config key cifar.data_dir)" in text
    assert "python -m repdiag.cifar.data download" in text


def test_the_branch_is_off_in_the_default_and_test_configs() -> None:
    """With no run, rules/cifar.smk adds nothing to `rule all`."""
    root = Path(__file__).resolve().parents[2]
    for name in ("config/config.yaml", "config/test.yaml"):
        config = fill_defaults(yaml.safe_load((root / name).read_text()))
        assert config["cifar"]["enabled"] is False and run_names(config["cifar"]) == []
