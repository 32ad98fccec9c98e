"""Helpers every study shares, written once: figures (palette, saving), tables and intervals."""
