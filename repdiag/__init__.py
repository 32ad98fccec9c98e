"""repdiag: what a vision representation encodes beyond its global geometry."""

__version__ = "0.1.0"

# The list of studies registers the packages whose config checks the core runs (repdiag.studies):
# imported here so that every entry point (workflow, CLI, library) has them.
from repdiag import studies as studies
