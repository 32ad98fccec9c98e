"""Offline enforced, not defaulted: jobs never reach a network, whatever the environment says.

:func:`enforce_offline` sets the Hugging Face switches to on (``HF_HUB_OFFLINE=1`` wins over a
user's ``HF_HUB_OFFLINE=0``, and over ``huggingface_hub.constants`` read before it was set) and
replaces the download functions of the libraries without such a switch, torch.hub
(``download_url_to_file``, behind ``load_state_dict_from_url``; timm's copy of it) and open_clip
(``download_pretrained_from_url``), with one that refuses, naming the URL. The workflow calls it
while parsing (``rules/common.smk``: every job inherits the environment) and the encoder factory
before every build (:func:`repdiag.encoders.factory.build_encoder`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from repdiag.core.errors import EncoderError

OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
"""Environment variables set in every job, over any value the user's environment has."""

DOWNLOADERS: tuple[tuple[str, str], ...] = (
    ("torch.hub", "download_url_to_file"),
    ("timm.models._hub", "download_url_to_file"),
    ("open_clip.pretrained", "download_pretrained_from_url"),
    ("open_clip.openai", "download_pretrained_from_url"),
)
"""(module, function) of every download function replaced when its module is imported."""


def refuse_download(url: Any = None, *args: Any, **kwargs: Any) -> NoReturn:
    """What every library download function becomes: an error naming the URL."""
    raise EncoderError(
        f"refusing to download {url}: repdiag jobs run offline (repdiag.core.offline). Fill the "
        "library cache on a machine with internet and copy it here, or give a local weights file"
    )


def enforce_offline() -> None:
    """Set :data:`OFFLINE_ENV` and replace the imported :data:`DOWNLOADERS` (idempotent).

    Modules not yet imported are left alone: call again after importing a library (the
    encoder factory does, per build).
    """
    os.environ.update(OFFLINE_ENV)
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    for module_name, function in DOWNLOADERS:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, function):
            setattr(module, function, refuse_download)
