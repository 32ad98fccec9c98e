"""Progress logging: interval from the environment, lines with done/total."""

from __future__ import annotations

import logging

import pytest

from repdiag.core.errors import ConfigError
from repdiag.core.runtime import PROGRESS_ENV, Progress, progress_interval


def test_progress_interval_defaults_to_ten_seconds(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    assert progress_interval() == 10.0


def test_progress_interval_zero_logs_every_update(monkeypatch, caplog):
    monkeypatch.setenv(PROGRESS_ENV, "0")
    progress = Progress(3, "steps", logger=logging.getLogger("repdiag.test"))
    with caplog.at_level(logging.INFO, logger="repdiag.test"):
        for _ in range(3):
            progress.update()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "steps: 1/3",
        "steps: 2/3",
        "steps: 3/3",
    ]


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_bad_progress_interval_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(PROGRESS_ENV, value)
    with pytest.raises(ConfigError, match=PROGRESS_ENV):
        progress_interval()
