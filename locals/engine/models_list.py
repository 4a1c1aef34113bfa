"""What is already downloaded in the shared Hugging Face cache, and what fits this machine."""

from __future__ import annotations

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
