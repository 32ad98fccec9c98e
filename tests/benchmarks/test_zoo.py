"""benchmarks/zoo.py's projection of a config's whole zoo from measured rates: the closed form
over the config's runs, with rendering's share, on config/test.yaml."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.planning import resolved_config

REPO = Path(__file__).resolve().parents[2]


def _zoo_benchmark():
    spec = importlib.util.spec_from_file_location("zoo_bench", REPO / "benchmarks" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_projection_is_steps_times_step_and_render_seconds(monkeypatch, capsys) -> None:
    bench = _zoo_benchmark()
    config = resolved_config()
    for run in config["zoo"]["objectives"].values():
        run["steps"] = 3600  # one step-second is one hour
    specs = bench.objective_specs(config)
    assert {"simclr", "supervised"} <= set(specs)
    monkeypatch.setattr(bench, "render_seconds", lambda spec, batches: 0.5)
    rows = {name: (None, (1.5, 0.0, 0.0), 0.0) for name in ("simclr", "supervised")}
    bench.print_projection(config, rows, specs, batches=1)
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:4]}
    runs = [bench.run_spec(config, run)["objective"] for run in bench.zoo_runs(config)]
    for name in rows:
        n_runs = runs.count(name)
        assert n_runs >= 1 and int(lines[name][1]) == n_runs and int(lines[name][2]) == 3600
        assert float(lines[name][6].rstrip("%")) == 25  # 0.5 / (0.5 + 1.5)
        assert float(lines[name][7]) == 2.0 * n_runs  # serial: step + render, hours
        assert float(lines[name][8]) == 1.5 * n_runs  # rendering beside: the step alone
