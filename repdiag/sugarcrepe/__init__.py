"""SugarCrepe: compositional image-text matching on natural images (data, scoring, report)."""
