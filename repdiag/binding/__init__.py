"""The binding study: controls (encoders whose binding score is known before any run)."""
