"""The fabricated run every analysis test reads: eight models' metrics, Jacobian stores and zoo
curves in the formats of docs/contracts.md (tests.binding.stats_fakes)."""

from __future__ import annotations

import pytest

from tests.binding.stats_fakes import fake_models, write_fake_results


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake")
    models = fake_models(8)
    qualities = write_fake_results(root, models)
    return root, models, qualities
