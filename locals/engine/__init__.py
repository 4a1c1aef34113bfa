"""The only package that imports mlx, mlx_lm and outlines_core.

The server reaches it through this facade (`_EXPORTS`: loading a model, rendering and encoding
prompts, the engine and its config, constraints). Names are imported lazily so
`import locals.engine` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "load_model": "locals.engine.load.models",
    "LoadedModel": "locals.engine.load.models",
    "render_prompt": "locals.engine.load.templates",
    "encode_prompt": "locals.engine.load.templates",
    "cache_points": "locals.engine.load.templates",
    "tool_parser": "locals.engine.load.models",
    "Engine": "locals.engine.engine",
    "create_engine": "locals.engine.assemble",
    "EngineConfig": "locals.engine.settings",
    "build_constraint": "locals.engine.constrain",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
