"""Binding metrics: geometry (G.PR, G.Iso, L.Iso), readouts, the Same/Different probe."""
