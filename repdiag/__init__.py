"""repdiag: what a vision representation encodes beyond its global geometry."""

__version__ = "0.1.0"
