"""Exceptions with messages that name the key, file or array at fault and say what to do."""


class RepdiagError(Exception):
    """Base class of every error repdiag raises on purpose."""


class ConfigError(RepdiagError, ValueError):
    """A config value is invalid; the message names the key."""


class StoreError(RepdiagError, OSError):
    """A zarr store is missing, partial, corrupt or holds non-finite values."""


class EncoderError(RepdiagError, ValueError):
    """An encoder entry cannot be built: unknown source or name, missing or unsafe weights."""


class RegistryError(RepdiagError, KeyError):
    """Unknown or duplicate name in a registry."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""
