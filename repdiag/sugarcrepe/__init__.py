"""SugarCrepe: compositional image-text matching on natural images (data, scoring, report)."""

CONFIG_CHECKS: tuple[str, ...] = ("repdiag.sugarcrepe.data:check_sugarcrepe_config",)
"""This study's cross-key config checks ("module:function"), run by core.config.check_config."""
