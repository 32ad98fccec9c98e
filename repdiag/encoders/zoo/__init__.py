"""The embedded zoo: small timm encoders trained inside the workflow with seven objectives.

Submodules: ``spec`` (config, torch-free), ``backbones``, ``heads``, ``augment``, ``objectives``
(one module per objective, registered in ``objectives.OBJECTIVES``), ``train``, ``checkpoint``
(safetensors + meta.json; ``load_zoo_model`` rebuilds a trained encoder), ``plot``.
This file imports nothing heavy: the workflow imports ``spec`` while parsing.
"""
