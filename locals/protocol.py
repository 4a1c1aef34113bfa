"""Plain dataclasses exchanged between the server, the engine, the CLI and the runner.

No MLX here: `agents/` and `integrations/` may import this module. The engine consumes
`GenerationRequest` and emits `TokenEvent`s followed by exactly one `FinishEvent`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Literal

_ids = itertools.count(1)


def new_request_id(prefix: str = "req") -> str:
    """A process-unique request id."""
    return f"{prefix}-{next(_ids)}"


@dataclass
class SamplingParams:
    """Per-request sampling settings; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 512
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0

    def problem(self) -> str | None:
        """What is out of range, in the API's field names, or None when every value can be used
        (a `top_k` of 0 or less is off, as vLLM's -1 and llama.cpp's 0 are)."""
        checks = [(self.max_tokens >= 1, "`max_tokens` must be at least 1"),
                  (0 <= self.temperature < float("inf"), "`temperature` must be 0 (greedy) or more, and finite"),
                  (0 <= self.top_p <= 1, "`top_p` must be between 0 and 1"),
                  (0 <= self.min_p <= 1, "`min_p` must be between 0 and 1")]
        return next((message for ok, message in checks if not ok), None)


@dataclass
class GenerationRequest:
    """One generation: prompt token ids plus how to sample; `constraint` is an engine TokenConstraint."""

    prompt_tokens: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    id: str = field(default_factory=new_request_id)
    constraint: Any = None
    # Prefix lengths (in tokens) where the prompt cache should keep an entry (message boundaries).
    cache_points: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Usage:
    """Token counts for one request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class TokenLogprob:
    """Log-probability of a chosen token and the top alternatives (token id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class TokenEvent:
    """New tokens of one request and the text they complete (stop strings already held back)."""

    request_id: str
    tokens: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    forced: bool = False
    # Part of the ending the constraint wrote because the budget or a guard ended the reply: a
    # tool call it completed was cut off, and is not handed on as a call (server/backend.py).
    closing: bool = False


# Why a request ended: "stop" (EOS, a stop string or token, the constraint complete), "length"
# (max_tokens, or the constraint closed for it), "cancelled", "error", "loop" (the repetition
# guard), "memory" (it could never fit).
FinishReason = Literal["stop", "length", "cancelled", "error", "loop", "memory"]


@dataclass
class FinishEvent:
    """The last event of a request."""

    request_id: str
    reason: FinishReason
    usage: Usage
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


Event = TokenEvent | FinishEvent


@dataclass
class EngineStats:
    """A snapshot of what the engine is doing, for /metrics, the dashboard and `locals status`."""

    model: str = ""
    running: int = 0
    waiting: int = 0
    prefilling: int = 0
    requests_total: int = 0
    requests_finished: int = 0
    prompt_tokens_total: int = 0
    generated_tokens_total: int = 0
    cached_tokens_total: int = 0
    decode_tokens_per_s: float = 0.0
    prefill_tokens_per_s: float = 0.0
    last_ttft_s: float = 0.0
    kv_bytes: int = 0
    kv_budget_bytes: int = 0
    weights_bytes: int = 0
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
