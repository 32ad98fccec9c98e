"""The error types: one base class, each also the builtin callers already catch (repdiag.core.errors)."""

from __future__ import annotations

import pytest

from repdiag.core.errors import (
    ConfigError,
    EncoderError,
    RegistryError,
    RepdiagError,
    StoreError,
)


@pytest.mark.parametrize(
    ("error", "builtin"),
    [(ConfigError, ValueError), (StoreError, OSError), (EncoderError, ValueError)],
)
def test_each_error_is_a_repdiag_error_and_its_builtin(error, builtin):
    with pytest.raises(RepdiagError):
        raise error("models.vit.id: unknown")
    with pytest.raises(builtin, match=r"^models\.vit\.id: unknown$"):
        raise error("models.vit.id: unknown")


def test_a_registry_error_is_a_key_error_with_a_readable_message():
    message = "unknown encoder source 'tim' (known: timm, open_clip)"
    with pytest.raises(KeyError) as caught:
        raise RegistryError(message)
    assert str(caught.value) == message  # a plain KeyError would show it quoted
    assert str(KeyError(message)) == repr(message)
    assert str(RegistryError()) == ""
