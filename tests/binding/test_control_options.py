"""What the controls assume about the images they score, and the config check that the dataset
is what they assume (repdiag.binding.control_options)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from repdiag.binding.control_options import (
    ASSUMES,
    DATASET_KEYS,
    DEFAULTS,
    check_controls_config,
)
from repdiag.core.config import fill_defaults
from repdiag.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def shipped(name: str = "config.yaml", **binding_changes) -> dict:
    """A shipped config with every schema default filled in, its dataset changed."""
    config = fill_defaults(yaml.safe_load((REPO / "config" / name).read_text()))
    config["datasets"]["binding"].update(binding_changes)
    return config


def test_the_table_is_the_controls_signatures_and_their_defaults():
    from repdiag.binding.controls import CONTROLS

    assert set(ASSUMES) == set(CONTROLS.names())
    for name in CONTROLS.names():
        parameters = inspect.signature(CONTROLS.get(name)).parameters
        assert set(ASSUMES[name]) == set(parameters) & set(DATASET_KEYS), name
        for argument in ASSUMES[name]:
            assert parameters[argument].default == DEFAULTS[argument], (name, argument)


def test_a_control_must_assume_the_images_it_scores():
    """A dataset that rotates further than the oracle looks is refused naming the model and both
    keys, and passes once the entry's kwargs say the dataset's value."""
    check_controls_config(shipped())  # config/config.yaml as shipped
    rotated = shipped(jitter={"position": 0.5, "scale": 0.1, "rotation_deg": 30})
    with pytest.raises(ConfigError) as err:
        check_controls_config(rotated)
    message = str(err.value)
    assert message.startswith("models.") and "rotation_deg is 15.0" in message
    assert "datasets.binding.jitter.rotation_deg is 30" in message
    assert "kwargs: {rotation_deg: 30}" in message
    for entry in rotated["models"].values():
        if entry.get("id", "").endswith(("shape_oracle", "bag_of_shapes")):
            entry["kwargs"] = {"rotation_deg": 30}
    check_controls_config(rotated)
    with pytest.raises(ConfigError, match=r"image_size is 64 but datasets\.binding\.image_size"):
        check_controls_config(shipped(image_size=96))
    with pytest.raises(ConfigError, match=r"grid is \(2, 2\) but datasets\.binding\.grid"):
        check_controls_config(shipped(grid=[3, 3]))


def test_the_paper_config_gives_its_controls_the_datasets_size():
    paper = shipped("paper.yaml")
    assert paper["datasets"]["binding"]["image_size"] == 224
    check_controls_config(paper)
    for entry in paper["models"].values():
        entry.pop("kwargs", None)  # the defaults assume the embedded default's 64 px
    with pytest.raises(ConfigError, match=r"image_size is 64 but datasets\.binding\.image_size"):
        check_controls_config(paper)


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"rotation_deg": None}, "models.oracle.kwargs.rotation_deg: None is not a number"),
        ({"rotation_deg": "30"}, "models.oracle.kwargs.rotation_deg: '30' is not a number"),
        ({"grid": "2x2"}, "models.oracle.kwargs.grid: '2x2' is not a list of two integers"),
        ({"shapes": "circle"}, "models.oracle.kwargs.shapes: 'circle' is not a list of shape"),
    ],
)
def test_a_malformed_kwarg_is_named(kwargs, shown):
    config = shipped()
    config["models"] = {
        "oracle": {
            "source": "python",
            "id": "repdiag.binding.controls:shape_oracle",
            "family": "control",
            "kwargs": kwargs,
        }
    }
    with pytest.raises(ConfigError) as err:
        check_controls_config(config)
    assert str(err.value).startswith(shown)


def test_validate_and_a_runs_start_refuse_the_mismatch(tmp_path):
    """Registered as a pre-run check: core.checks.check_before_run (what `repdiag validate` and
    a run's onstart call) refuses it; loading the config, which every cluster job's Snakemake
    does with the default's models, does not."""
    from repdiag.core.checks import check_before_run

    rotated = shipped(jitter={"position": 0.5, "scale": 0.1, "rotation_deg": 30})
    with pytest.raises(ConfigError, match="rotation_deg"):
        check_before_run(rotated, {"shape_oracle"}, weights=False)
    check_before_run(rotated, {"random_resnet"}, weights=False)  # not a control: nothing to see


def test_the_check_imports_no_torch():
    code = "import sys; import repdiag.binding.control_options; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
