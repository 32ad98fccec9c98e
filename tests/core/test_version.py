"""The version has one home (repdiag.core.version): the package and the build read it there."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import repdiag
from repdiag.core.version import __version__


def test_the_package_and_the_build_read_the_one_version():
    assert repdiag.__version__ == __version__
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "repdiag.core.version.__version__"
    assert importlib.metadata.version("repdiag") == __version__  # the installed build's
