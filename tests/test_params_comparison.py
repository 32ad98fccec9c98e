"""The params comparison of a refactor's before/after check (tests/params.py)."""

from __future__ import annotations

import json

from tests.params import compare, main

BEFORE = {
    "config/test.yaml:all": {"train_zoo:[('run', 'a')]": {"lr": 0.001, "steps": 3}},
    "config/paper.yaml:binding_causal": "refused: no models",
}


def test_equal_records_compare_equal_and_every_job_is_counted():
    assert compare(BEFORE, json.loads(json.dumps(BEFORE))) == (1, [])


def test_a_changed_param_a_missing_job_and_a_plan_now_refused_are_each_named():
    after = {
        "config/test.yaml:all": {
            "train_zoo:[('run', 'a')]": {"lr": 0.002, "steps": 3},
            "train_zoo:[('run', 'b')]": {"lr": 0.001, "steps": 3},
        },
        "config/paper.yaml:binding_causal": {"render_binding:[]": {}},
    }
    compared, found = compare(BEFORE, after)
    assert compared == 2 and len(found) == 3
    assert any("('run', 'a')" in line and "0.002" in line for line in found)
    assert any(
        "('run', 'b')" in line and line.endswith("-> {'lr': 0.001, 'steps': 3}") for line in found
    )
    assert any(line.startswith("config/paper.yaml:binding_causal: 'refused") for line in found)


def test_the_command_exits_1_on_a_difference_and_0_without(tmp_path, capsys):
    same, other = tmp_path / "a.json", tmp_path / "b.json"
    same.write_text(json.dumps(BEFORE))
    other.write_text(json.dumps({**BEFORE, "config/test.yaml:all": {}}))
    assert main(["compare", str(same), str(same)]) == 0
    assert main(["compare", str(same), str(other)]) == 1
    assert "1 jobs compared, 1 differ" in capsys.readouterr().out
    assert main(["nonsense"]) == 2
