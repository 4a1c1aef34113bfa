"""A decode step beside a prompt chunk, on the embedded model through a real engine: the decoding
rows run as their compiled step and the chunk as a pass of its own (forward.py's split), and every
request writes what it writes alone."""

from __future__ import annotations

from locals.engine.engine import Engine
from locals.engine.forward import forward as forward_mod
from locals.engine.settings import EngineConfig
from locals.protocol import GenerationRequest, SamplingParams

from tests.helpers.engine_runs import Collector, make_prompts, run_alone, wait_for
from tests.helpers.kernel_models import as_on_a_gpu


def test_a_prompt_read_beside_decoding_rows_splits_the_step_and_changes_no_token(smollm2, monkeypatch):
    splits = []
    split = forward_mod._split
    monkeypatch.setattr(forward_mod, "_split", lambda *a: splits.append(len(a[1])) or split(*a))
    settings = dict(prefix_cache_bytes=0, max_batch=4, speculate=False, step_token_budget=64)
    engine = Engine(smollm2, EngineConfig(forward=as_on_a_gpu(), **settings))
    plain = Engine(smollm2, EngineConfig(**settings))  # the CPU's: one eager pass a step
    engine.start()
    plain.start()
    try:
        short = make_prompts(smollm2.tokenizer, [5, 9, 14])
        long = make_prompts(smollm2.tokenizer, [150])[0]  # three chunks beside the decoding rows
        c = Collector()
        ids = [c.submit(engine, GenerationRequest(p, SamplingParams(max_tokens=40, temperature=0))) for p in short]
        assert wait_for(lambda: all(len(c.tokens(rid)) >= 2 for rid in ids), timeout=120)
        ids.append(c.submit(engine, GenerationRequest(long, SamplingParams(max_tokens=8, temperature=0))))
        c.wait(300)
        assert splits and max(splits) == 4  # three decoding rows and a chunk, split
        for rid, prompt, n in zip(ids, short + [long], (40, 40, 40, 8)):
            assert c.tokens(rid) == run_alone(plain, prompt, max_tokens=n, temperature=0)[0]
    finally:
        engine.stop()
        plain.stop()
