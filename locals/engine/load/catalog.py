"""The model catalog: aliases, Ollama names and the default model per backend and memory.

Pure data and lookups (no MLX), so the CLI can list models without loading one.
"""

from __future__ import annotations

from dataclasses import dataclass

EMBEDDED = "smollm2"
GIB = 1024**3


@dataclass(frozen=True)
class Alias:
    """A short name users type, the weights it stands for, and the name editors show."""

    name: str
    repo: str
    editor_name: str
    size_gb: float
    note: str = ""


ALIASES: dict[str, Alias] = {a.name: a for a in [
    Alias("qwen", "mlx-community/Qwen3.5-4B-MLX-4bit", "locals/qwen3.5-4b", 2.8,
          "default on a Mac with 12 GB or more"),
    Alias("qwen3.5-2b", "mlx-community/Qwen3.5-2B-MLX-4bit", "locals/qwen3.5-2b", 1.4,
          "default under 12 GB"),
    Alias("lfm", "mlx-community/LFM2.5-2.6B-4bit", "locals/lfm2.5-2.6b", 1.5),
    Alias("minicpm", "mlx-community/MiniCPM5-2B-4bit", "locals/minicpm5-2b", 1.3),
    Alias("gemma", "mlx-community/gemma-4-e4b-it-4bit", "locals/gemma-4-e4b-it", 4.8),
    Alias(EMBEDDED, "embedded:SmolLM2-135M-Instruct.Q4_1.gguf", "locals/smollm2-135m", 0.1,
          "ships with locals; works offline"),
]}

# Ollama model names -> an alias or an MLX repo with the same weights.
OLLAMA_NAMES = {
    "qwen3.5:4b": "qwen", "qwen3.5": "qwen", "qwen3.5:2b": "qwen3.5-2b",
    "lfm2.5:2.6b": "lfm", "lfm2.5": "lfm", "minicpm5:2b": "minicpm", "gemma4:e4b": "gemma",
    "smollm2:135m": EMBEDDED, "smollm2": EMBEDDED,
    "qwen2.5-coder:7b": "mlx-community/Qwen2.5-Coder-7B-Instruct-4bit",
    "qwen2.5-coder:3b": "mlx-community/Qwen2.5-Coder-3B-Instruct-4bit",
    "qwen3:4b": "mlx-community/Qwen3-4B-4bit", "qwen3:8b": "mlx-community/Qwen3-8B-4bit",
    "llama3.2:3b": "mlx-community/Llama-3.2-3B-Instruct-4bit",
    "llama3.2:1b": "mlx-community/Llama-3.2-1B-Instruct-4bit",
    "llama3.1:8b": "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
    "mistral:7b": "mlx-community/Mistral-7B-Instruct-v0.3-4bit",
}


def suggest_mlx_repo(name: str) -> str:
    """A best-guess MLX repo for a model name from another ecosystem (Ollama, GGUF)."""
    base = name.split("/")[-1].replace(":", "-").replace("_", "-")
    for suffix in ("-gguf", "-GGUF", ".gguf"):
        base = base.removesuffix(suffix)
    return f"mlx-community/{base}-4bit"


def default_alias(backend_kind: str, memory_bytes: int) -> str:
    """The model that suits this machine: the embedded one on CPU, else Qwen3.5 by memory."""
    if backend_kind == "cpu":
        return EMBEDDED
    return "qwen" if memory_bytes >= 12 * GIB else "qwen3.5-2b"


def split_thinking(name: str) -> tuple[str, bool]:
    """'lfm-thinking' -> ('lfm', True): the suffix turns the template's thinking mode on."""
    if name.endswith("-thinking"):
        return name[: -len("-thinking")], True
    return name, False


def strip_editor_prefix(name: str) -> str:
    """'locals/qwen3.5-4b' (an editor's model name) -> 'qwen'; other names unchanged."""
    for alias in ALIASES.values():
        if name == alias.editor_name:
            return alias.name
    return name
