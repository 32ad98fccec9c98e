"""The package version, in one place: ``repdiag.__version__`` and the build's
(pyproject.toml: ``[tool.setuptools.dynamic]``) read it here; stores and zoo runs record it."""

__version__ = "0.1.0"
