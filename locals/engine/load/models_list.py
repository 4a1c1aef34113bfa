"""What is already downloaded in the shared Hugging Face cache, and what fits this machine."""

from __future__ import annotations

import re

import psutil

# Weights may take this share of memory; the rest is KV cache, the OS and other apps.
WEIGHTS_SHARE = 0.6


def downloaded_models() -> list[tuple[str, int]]:
    """(repo id, bytes on disk) of cached model repos that hold safetensors weights."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir()
    except CacheNotFound:
        return []
    out = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        files = {f.file_name for rev in repo.revisions for f in rev.files}
        if any(name.endswith(".safetensors") for name in files):
            out.append((repo.repo_id, repo.size_on_disk))
    return sorted(out)


def fits(weight_bytes: float, memory_bytes: int | None = None) -> bool:
    """True when weights of this size leave room for KV cache and the system."""
    memory = memory_bytes or psutil.virtual_memory().total
    return weight_bytes <= WEIGHTS_SHARE * memory


def loaded_bytes(size_on_disk: float, name: str, dense: bool) -> float:
    """Memory the weights take once loaded: as stored, or float32 where the backend runs dense
    weights (`name`'s "4bit"/"8bit"/"Q4_1" says the stored width; 16 bits when it says none)."""
    if not dense:
        return size_on_disk
    found = re.search(r"(?:(\d+)-?bit|Q(\d+)_)", name, re.IGNORECASE)
    bits = int(found.group(1) or found.group(2)) if found else 16
    return size_on_disk * 32 / max(bits, 1)
