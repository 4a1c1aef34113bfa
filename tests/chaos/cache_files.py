"""What a killed server left in a locals home's caches: every prompt-cache file, compiled
automaton and tuning table checked as its reader checks it.
"""

from __future__ import annotations

import json
import mmap
import pickle
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CacheCheck:
    checked: int = 0
    torn: list[str] = field(default_factory=list)  # final names whose content fails its check


def _kv_ok(path: Path) -> bool:
    from locals.engine.cache.disk_cache import decode

    with open(path, "rb") as f:
        if not path.stat().st_size:
            return False
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return decode(data, path.parent.name) is not None  # the folder is named by the model key


def _automaton_ok(path: Path) -> bool:
    from locals.engine.constrain.compile import _unsealed

    payload = _unsealed(path.read_bytes())
    if payload is None:
        return False
    pickle.loads(payload)
    return True


def _table_ok(path: Path) -> bool:
    from locals.engine.kernels.tuning.tuner import TuningTable

    try:
        TuningTable(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        return False
    return True


def check_caches(home: Path) -> CacheCheck:
    """Check every cache file under `home` (a LOCALS_HOME)."""
    cache = home / "cache"
    result = CacheCheck()
    readers = [(cache / "prompts", "*/*.kv", _kv_ok), (cache / "constraint", "*.index", _automaton_ok),
               (cache / "tuning", "*.json", _table_ok)]
    for folder, pattern, ok in readers:
        for path in sorted(folder.glob(pattern)):
            result.checked += 1
            if not ok(path):
                result.torn.append(str(path.relative_to(home)))
    return result
