"""Admission: whether a waiting request may take KV memory now, later, or never.

`check` answers "admit" (and reserves the request's memory), "wait", or any other
string: the reason it can never fit (the request then finishes with reason "memory").
`release` gives the reservation back when the request ends.
"""

from __future__ import annotations

from typing import Protocol

from locals.protocol import GenerationRequest

ADMIT = "admit"
WAIT = "wait"


class Admission(Protocol):
    def check(self, request: GenerationRequest) -> str: ...

    def release(self, request: GenerationRequest) -> None: ...


class KVBudgetAdmission:
    """Admit while the estimated KV of prompt + max_tokens of all admitted requests fits the budget."""

    def __init__(self, budget_bytes: int, bytes_per_token: int):
        self.budget_bytes = budget_bytes
        self.bytes_per_token = bytes_per_token
        self.reserved: dict[str, int] = {}

    def estimate(self, request: GenerationRequest) -> int:
        return (len(request.prompt_tokens) + request.sampling.max_tokens) * self.bytes_per_token

    @property
    def reserved_bytes(self) -> int:
        return sum(self.reserved.values())

    def check(self, request: GenerationRequest) -> str:
        need = self.estimate(request)
        if need > self.budget_bytes:
            return (
                f"needs ~{need / 2**20:.0f} MiB of KV cache for {len(request.prompt_tokens)} prompt + "
                f"{request.sampling.max_tokens} new tokens, over the {self.budget_bytes / 2**20:.0f} MiB "
                "budget; shorten the prompt or lower max_tokens"
            )
        if self.reserved_bytes + need > self.budget_bytes:
            return WAIT
        self.reserved[request.id] = need
        return ADMIT

    def release(self, request: GenerationRequest) -> None:
        self.reserved.pop(request.id, None)
