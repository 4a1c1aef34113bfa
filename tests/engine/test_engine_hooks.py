"""Engine hooks and sampling: seeded reproducibility, logprobs, constraint masks / forced and
closing tokens, a failing constraint, guards, admission, prefix reuse, the asyncio adapter."""

from __future__ import annotations

import json

import asyncio

import mlx.core as mx
import pytest

from locals.engine.admission import KVBudgetAdmission
from locals.engine.constrain.contract import TokenConstraint
from locals.engine.engine import FREE_RUN, Engine
from locals.engine.settings import EngineConfig
from locals.protocol import FinishEvent, GenerationRequest, SamplingParams, TokenEvent

from tests.helpers.engine_runs import Collector, make_prompts, run_alone


def bitmask(allowed: set[int], vocab: int) -> mx.array:
    words = [0] * ((vocab + 31) // 32)
    for t in allowed:
        words[t // 32] |= 1 << (t % 32)
    return mx.array(words, dtype=mx.uint32)


class AllowedSet(TokenConstraint):
    """A small TokenConstraint: only `allowed` may be sampled; after `trigger`, `forced` follow;
    `closing` ends the output; complete once `end` was accepted."""

    def __init__(self, vocab, allowed, trigger=None, forced=(), closing=(), end=None):
        self.vocab, self.allowed = vocab, set(allowed)
        self.trigger, self.forced, self.closing, self.end = trigger, list(forced), list(closing), end
        self.accepted: list[int] = []
        self._force_next = False

    def mask(self):
        return bitmask(self.allowed, self.vocab)

    def accept(self, token):
        if token not in self.allowed and token not in self.forced and token not in self.closing:
            raise ValueError(f"token {token} not allowed")
        self.accepted.append(token)
        self._force_next = token == self.trigger

    def forced_tokens(self):
        return list(self.forced) if self._force_next else []

    def closing_tokens(self):
        return list(self.closing)

    def is_complete(self):
        return self.end is not None and self.end in self.accepted


class Raising(AllowedSet):
    def mask(self):
        if len(self.accepted) >= 2:
            raise RuntimeError("automaton broke")
        return super().mask()


def test_seeded_sampling_reproducible_regardless_of_batch(engine, tiny_llama):
    prompts = make_prompts(tiny_llama.tokenizer, [6, 14, 25])
    params = dict(max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, seed=1234)
    alone, _, _ = run_alone(engine, prompts[0], **params)
    c = Collector()
    rid = c.submit(engine, GenerationRequest(prompts[0], SamplingParams(**params)))
    for p in prompts[1:]:
        c.submit(engine, GenerationRequest(p, SamplingParams(max_tokens=16, temperature=0.8, seed=7)))
    c.wait()
    assert c.tokens(rid) == alone
    other, _, _ = run_alone(engine, prompts[0], **{**params, "seed": 99})
    assert other != alone


def test_top_k_one_is_greedy(engine, tiny_llama):
    prompt = make_prompts(tiny_llama.tokenizer, [10])[0]
    greedy, _, _ = run_alone(engine, prompt, max_tokens=10)
    assert run_alone(engine, prompt, max_tokens=10, temperature=1.5, top_k=1, seed=3)[0] == greedy


def test_logprobs_and_top_logprobs(engine, tiny_llama):
    prompt = make_prompts(tiny_llama.tokenizer, [10])[0]
    c = Collector()
    rid = c.submit(engine, GenerationRequest(prompt, SamplingParams(max_tokens=5, logprobs=True, top_logprobs=3)))
    c.wait()
    events = [ev for ev in c.events[rid] if isinstance(ev, TokenEvent) and ev.tokens]
    assert len(events) == 5
    for ev in events:
        lp = ev.logprobs[0]
        assert lp.token == ev.tokens[0] and lp.logprob <= 0
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token  # greedy picks the most likely
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def test_constraint_mask_forced_and_complete(engine, tiny_llama):
    vocab = tiny_llama.vocab_size
    allowed = {100, 200, 300}
    constraint = AllowedSet(vocab, allowed, trigger=200, forced=[7, 8], end=300)
    c = Collector()
    rid = c.submit(engine, GenerationRequest([1, 2, 3, 4], SamplingParams(max_tokens=60), constraint=constraint))
    c.wait()
    tokens = c.tokens(rid)
    assert tokens == constraint.accepted
    for i, t in enumerate(tokens):
        if t in (7, 8):
            assert tokens[i - 1] in (200, 7)
        else:
            assert t in allowed
    forced = [ev for ev in c.events[rid] if isinstance(ev, TokenEvent) and ev.forced]
    assert all(ev.tokens[0] in (7, 8) for ev in forced)
    assert c.finish(rid).reason == ("stop" if 300 in tokens else "length")


def test_forced_tokens_extend_the_kv_like_sampled_ones(tiny_llama, engine):
    # After a forced chunk the next sampled token must match running the same tokens unforced.
    vocab = tiny_llama.vocab_size
    forced_run = AllowedSet(vocab, {50, 60}, trigger=50, forced=[70, 80])
    c = Collector()
    rid = c.submit(engine, GenerationRequest([5, 6, 7], SamplingParams(max_tokens=12), constraint=forced_run))
    c.wait()
    tokens = c.tokens(rid)
    if 50 not in tokens[:-3]:
        pytest.skip("the random model never chose the trigger token")
    i = tokens.index(50)
    prefix = [5, 6, 7] + tokens[: i + 3]  # up to and including the forced tokens
    replay = AllowedSet(vocab, {50, 60})
    c2 = Collector()
    rid2 = c2.submit(engine, GenerationRequest(prefix, SamplingParams(max_tokens=1), constraint=replay))
    c2.wait()
    assert c2.tokens(rid2) == tokens[i + 3 : i + 4]


def test_closing_tokens_when_max_tokens_runs_out(engine, tiny_llama):
    constraint = AllowedSet(tiny_llama.vocab_size, {100, 200}, closing=[9, 10])
    c = Collector()
    rid = c.submit(engine, GenerationRequest([1, 2], SamplingParams(max_tokens=8), constraint=constraint))
    c.wait()
    tokens = c.tokens(rid)
    assert len(tokens) == 8 and tokens[-2:] == [9, 10]
    assert c.finish(rid).reason == "length"
    # the ending is marked, so the server can tell a call it completed was cut off
    marks = [(t, ev.closing) for ev in c.events[rid] if isinstance(ev, TokenEvent) for t in ev.tokens]
    assert [m for _, m in marks] == [False] * 6 + [True, True]


def test_raising_constraint_fails_only_its_request(engine, tiny_llama):
    prompts = make_prompts(tiny_llama.tokenizer, [5, 9])
    alone = run_alone(engine, prompts[0], max_tokens=12)[0]
    c = Collector()
    good = c.submit(engine, GenerationRequest(prompts[0], SamplingParams(max_tokens=12)))
    bad = c.submit(engine, GenerationRequest(prompts[1], SamplingParams(max_tokens=12),
                                             constraint=Raising(tiny_llama.vocab_size, set(range(1000)))))
    c.wait()
    assert c.finish(bad).reason == "error" and "automaton broke" in c.finish(bad).error
    assert c.tokens(good) == alone
    assert run_alone(engine, prompts[0], max_tokens=12)[0] == alone  # the engine still runs


def test_rejected_token_fails_request(engine):
    class Rejecting(AllowedSet):
        def accept(self, token):
            raise ValueError("not allowed here")

    fin = run_alone_with(engine, GenerationRequest([1, 2], SamplingParams(max_tokens=5),
                                                   constraint=Rejecting(49152, {3})))
    assert fin.reason == "error" and "not allowed here" in fin.error


def run_alone_with(engine, request) -> FinishEvent:
    c = Collector()
    rid = c.submit(engine, request)
    c.wait()
    return c.finish(rid)


def test_guard_ends_request_with_its_reason(tiny_llama):
    class StopAfter:
        def __init__(self, n):
            self.n = n

        def on_token(self, token, output):
            return "loop" if len(output) >= self.n else None

    eng = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0),
                 guards=[lambda req: StopAfter(4) if req.meta.get("guard") else None])
    eng.start()
    try:
        fin = run_alone_with(eng, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=20), meta={"guard": 1}))
        assert fin.reason == "loop" and fin.usage.completion_tokens == 4
        assert run_alone_with(eng, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=20))).reason == "length"
    finally:
        eng.stop()


def test_a_guard_stopping_inside_a_constrained_value_closes_it(tiny_llama):
    from locals.engine import build_constraint

    class StopAfter:
        def on_token(self, token, output):
            return "loop" if len(output) >= 4 else None  # after {"note": — the value still open

    schema = {"type": "object", "properties": {"note": {"type": "string"}}, "required": ["note"]}
    eng = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0), guards=[lambda req: StopAfter()])
    eng.start()
    try:
        c = Collector()
        rid = c.submit(eng, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=200, temperature=1.0, seed=3),
                                              constraint=build_constraint(tiny_llama, json_schema=schema)))
        c.wait()
        assert c.finish(rid).reason == "loop", c.text(rid)
        assert isinstance(json.loads(c.text(rid))["note"], str), repr(c.text(rid))  # cut by the guard, closed by the constraint
        tokens = c.tokens(rid)
        assert len(tokens) > 4 and c.finish(rid).usage.completion_tokens == len(tokens)  # the closing counts
    finally:
        eng.stop()


def test_admission_waits_then_rejects_what_never_fits(tiny_llama):
    probe = Engine(tiny_llama)
    per_token = probe.bytes_per_token
    eng = Engine(tiny_llama, EngineConfig(kv_budget_bytes=per_token * 40, prefix_cache_bytes=0))
    eng.start()
    try:
        c = Collector()
        a = c.submit(eng, GenerationRequest([1] * 10, SamplingParams(max_tokens=20)))
        b = c.submit(eng, GenerationRequest([2] * 10, SamplingParams(max_tokens=20)))  # waits for a
        too_big = c.submit(eng, GenerationRequest([3] * 30, SamplingParams(max_tokens=20)))
        c.wait()
        assert c.finish(a).reason == "length" and c.finish(b).reason == "length"
        assert c.finish(too_big).reason == "memory" and "max_tokens" in c.finish(too_big).error
        assert eng.stats().kv_budget_bytes == per_token * 40
    finally:
        eng.stop()


def test_kv_budget_admission_unit():
    adm = KVBudgetAdmission(budget_bytes=1000, bytes_per_token=10)
    small = GenerationRequest([1] * 20, SamplingParams(max_tokens=30))
    other = GenerationRequest([1] * 20, SamplingParams(max_tokens=30))
    assert adm.check(small) == "admit" and adm.reserved_bytes == 500
    assert adm.check(other) == "admit"
    assert adm.check(GenerationRequest([1], SamplingParams(max_tokens=1))) == "wait"
    adm.release(small)
    assert adm.reserved_bytes == 500
    assert "budget" in adm.check(GenerationRequest([1] * 200, SamplingParams(max_tokens=1)))


def test_prefix_cache_reuse_gives_same_output(tiny_llama):
    eng = Engine(tiny_llama, EngineConfig(step_token_budget=16))
    eng.start()
    try:
        prompt = make_prompts(tiny_llama.tokenizer, [50])[0]
        first_tokens, _, first = run_alone(eng, prompt, max_tokens=8)
        assert first.usage.cached_tokens == 0
        again, _, fin = run_alone(eng, prompt, max_tokens=8)
        assert fin.usage.cached_tokens == 49 and again == first_tokens
        # A longer prompt sharing the first 50 tokens reuses them and continues correctly.
        longer = prompt + first_tokens + [5, 6]
        reused, _, fin = run_alone(eng, longer, max_tokens=6)
        assert fin.usage.cached_tokens >= 50
        fresh = Engine(tiny_llama, EngineConfig(prefix_cache_bytes=0))
        fresh.start()
        try:
            assert run_alone(fresh, longer, max_tokens=6)[0] == reused
        finally:
            fresh.stop()
        assert eng.stats().cached_tokens_total >= 99
    finally:
        eng.stop()


def test_cache_points_are_inserted(tiny_llama):
    from locals.engine.cache.prefix_cache import MemoryPrefixCache

    cache = MemoryPrefixCache(1 << 30)
    eng = Engine(tiny_llama, EngineConfig(step_token_budget=8), prefix_cache=cache)
    eng.start()
    try:
        prompt = list(range(10, 40))
        run_alone_with(eng, GenerationRequest(prompt, SamplingParams(max_tokens=2), cache_points=[12]))
        n, kv = cache.lookup(prompt[:12] + [999])
        assert n == 12 and kv[0][0].shape[2] >= 12
    finally:
        eng.stop()


async def test_stream_adapter_and_early_exit_cancels(engine):
    events = [ev async for ev in engine.stream(GenerationRequest([1, 2, 3], SamplingParams(max_tokens=4)))]
    assert isinstance(events[-1], FinishEvent) and events[-1].usage.completion_tokens == 4
    request = GenerationRequest([1, 2, 3], SamplingParams(max_tokens=100_000))
    agen = engine.stream(request)
    async for ev in agen:
        break
    await agen.aclose()
    for _ in range(3000):  # up to a minute on a busy machine
        if engine.stats().requests_finished == engine.stats().requests_total:
            break
        await asyncio.sleep(0.02)
    assert engine.stats().extra["finish_reasons"].get("cancelled") == 1


def test_generate_adapter_and_empty_prompt(engine):
    events = list(engine.generate(GenerationRequest([1, 2], SamplingParams(max_tokens=3))))
    assert sum(len(e.tokens) for e in events if isinstance(e, TokenEvent)) == 3
    fin = list(engine.generate(GenerationRequest([], SamplingParams(max_tokens=3))))[-1]
    assert fin.reason == "error" and "empty prompt" in fin.error


def test_output_the_constraint_closed_for_the_budget_finishes_length(engine, tiny_llama):
    """A constraint that completes because it spent its budget on closing reports "length"."""
    constraint = AllowedSet(tiny_llama.vocab_size, {300}, end=300)
    constraint.closed_by_budget = True
    c = Collector()
    rid = c.submit(engine, GenerationRequest([1, 2, 3], SamplingParams(max_tokens=50), constraint=constraint))
    c.wait()
    assert c.tokens(rid) == [300]
    assert c.finish(rid).reason == "length"


class FreeUntil(TokenConstraint):
    """Free text (no mask) until `trigger` is accepted; then `forced` follow and only `allowed`."""

    def __init__(self, vocab, trigger, allowed, forced=()):
        self.vocab, self.trigger, self.allowed, self.forced = vocab, trigger, set(allowed), list(forced)
        self.accepted: list[int] = []
        self.masked = self._force_next = False

    def unmasked(self):
        return not self.masked

    def mask(self):
        return bitmask(self.allowed, self.vocab) if self.masked else None

    def accept(self, token):
        if self.masked and token not in self.allowed and token not in self.forced:
            raise ValueError(f"token {token} not allowed after the trigger")
        self.accepted.append(token)
        self._force_next = token == self.trigger and not self.masked
        self.masked = self.masked or token == self.trigger

    def forced_tokens(self):
        return list(self.forced) if self._force_next else []

    def closing_tokens(self):
        return []

    def is_complete(self):
        return False


@pytest.mark.parametrize("forced", [(), (5, 6)], ids=["masked", "forced-then-masked"])
@pytest.mark.parametrize("sampling", [dict(max_tokens=14), dict(max_tokens=14, temperature=1.0, seed=11)],
                         ids=["greedy", "seeded"])
def test_free_text_rows_run_ahead_and_take_back_the_draw_after_a_trigger(tiny_llama, sampling, forced):
    # A constrained row in free text keeps pipelining; the token sampled ahead after the
    # trigger is dropped and drawn again under the mask: same output as never running ahead.
    prompt, mate = make_prompts(tiny_llama.tokenizer, [9, 17])
    outputs, taken_back = {}, {}
    for pipeline in (False, True):
        eng = Engine(tiny_llama, EngineConfig(pipeline=pipeline, speculate=False, prefix_cache_bytes=0))
        eng.start()
        try:
            free, _, _ = run_alone(eng, prompt, **sampling)
            i = free.index(free[2])  # the trigger's first place (a random model may repeat itself)
            allowed = {t for t in range(40, 60) if t != free[i + 1]}
            constraint = FreeUntil(tiny_llama.vocab_size, free[i], allowed, forced)
            c = Collector()
            rid = c.submit(eng, GenerationRequest(prompt, SamplingParams(**sampling), constraint=constraint))
            c.submit(eng, GenerationRequest(mate, SamplingParams(max_tokens=20)))
            c.wait()
            tokens = c.tokens(rid)
            taken_back[pipeline] = eng.stats().extra["taken_back_tokens"]
        finally:
            eng.stop()
        assert tokens[: i + 1] == free[: i + 1]  # free text is the unconstrained output
        after = tokens[i + 1 :]
        assert after[: len(forced)] == list(forced) and all(t in allowed for t in after[len(forced) :])
        outputs[pipeline] = tokens
    assert outputs[True] == outputs[False]
    assert taken_back == {False: 0, True: 1}


class ForcedEvery(AllowedSet):
    """Forces its tokens after every `every`-th sampled token."""

    def __init__(self, vocab, allowed, every, **kw):
        super().__init__(vocab, allowed, **kw)
        self.every, self.sampled = every, 0

    def accept(self, token):
        super().accept(token)
        if token in self.allowed:
            self.sampled += 1
            self._force_next = self.sampled % self.every == 0


@pytest.mark.parametrize("sampling", [dict(max_tokens=64), dict(max_tokens=64, temperature=1.2, seed=5)])
def test_constrained_rows_pipeline_their_forward_pass_with_the_same_output(tiny_llama, sampling):
    # Constrained rows need their last token before their mask: once they write a value (no
    # forced tokens for FREE_RUN tokens) the engine queues the next forward pass first and
    # masks its sampling after reading (begin/finish). Forced tokens that arrive meanwhile
    # drop that row's draw. Output must equal the synchronous engine's.
    vocab = tiny_llama.vocab_size
    prompts = make_prompts(tiny_llama.tokenizer, [7, 12, 19, 5])
    runs, queued = {}, {}
    modes = {"sync": dict(pipeline=False), "read first": dict(pipeline=True, pipeline_masks=False),
             "masked": dict(pipeline=True)}
    for mode, options in modes.items():
        eng = Engine(tiny_llama, EngineConfig(speculate=False, prefix_cache_bytes=0, **options))
        begin = eng.runner.begin
        queued[mode] = 0

        def spy(slots, queue=False, begin=begin, mode=mode):
            queued[mode] += int(queue)
            return begin(slots, queue)

        eng.runner.begin = spy
        eng.start()
        try:
            c = Collector()
            ids = []
            for j, p in enumerate(prompts[:3]):  # long free runs, then forced tokens, at different rhythms
                constraint = ForcedEvery(vocab, {30 + j, 40 + j}, every=FREE_RUN + 12 + j, forced=[5, 6], closing=[9])
                ids.append(c.submit(eng, GenerationRequest(p, SamplingParams(**sampling), constraint=constraint)))
            ids.append(c.submit(eng, GenerationRequest(prompts[3], SamplingParams(**sampling))))
            c.wait()
            runs[mode] = [c.tokens(i) for i in ids]
            assert all(c.finish(i).reason in ("stop", "length") for i in ids)
            assert eng.stats().extra["masks_after_steps"] == queued[mode]
        finally:
            eng.stop()
    assert runs["masked"] == runs["read first"] == runs["sync"]
    assert queued["sync"] == queued["read first"] == 0 and queued["masked"] > 10
    for j, tokens in enumerate(runs["masked"][:3]):
        assert tokens and set(tokens) <= {30 + j, 40 + j, 5, 6, 9}
    assert any(5 in tokens for tokens in runs["masked"][:3]), "no row took the forced path"


def test_a_pass_is_queued_before_its_cache_point_is_snapshotted():
    # A whole step's head kernel writes the decode batch's cache without MLX seeing it, so a
    # snapshot of a prefix the pass just completed must be evaluated after the pass, not before.
    from types import SimpleNamespace

    from locals.engine.step import StepRunner

    events = []
    runner = StepRunner(None, on_cache_point=lambda seq, n: events.append(("snapshot", n)))
    runner.on_queue = lambda *a: events.append(("queued", a[0]))
    logits = mx.zeros((1, 4))

    def slot(points, offset):
        kv = SimpleNamespace(offset=offset)
        return SimpleNamespace(seq=SimpleNamespace(id="s", cache_points=list(points), kv=kv))

    runner._cache_points([slot([12, 30], 13)], {"s": 10}, logits)
    assert events == [("queued", logits), ("snapshot", 12)]
    events.clear()
    runner._cache_points([slot([30], 13)], {"s": 10}, logits)  # no point reached: nothing queued early
    runner._cache_points([slot([12], 13)], {"s": 10}, None)  # queued already (pipelined steps)
    assert events == [("snapshot", 12)]
