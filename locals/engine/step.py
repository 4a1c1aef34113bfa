"""Runs one scheduled step on the device and, later, turns its results into events.

`launch` builds the forward pass and the batch's sampling lazily and queues them
(`mx.async_eval`); `process` reads the tokens back and hands each to its sequence.
Between the two the engine may launch the next step, so the device never waits on Python.
When a constrained row's next mask needs the token still in flight, the engine splits the
launch: `begin` queues the forward pass, `process` reads the step before, `finish` samples
with the masks then known, so the device runs the pass while Python reads and masks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

from locals.engine.forward.choices import ForwardChoices
from locals.engine.forward.forward import CompiledBlocks, RowInput, forward, supports_ragged
from locals.engine.forward.host_attention import SOFTMAX_ON_HOST
from locals.engine.forward.rowfeed import RowOf, as_array
from locals.engine.rows.sampling import RowSampling, Sampled, sample
from locals.engine.scheduler import Slot
from locals.engine.stats import reserved_bytes
from locals.engine.rows.sequence import Sequence
from locals.protocol import TokenLogprob


@dataclass
class Verify:
    """A sampled row of a step: where its tokens start in the step's draws, and its draft."""

    seq: Sequence
    start: int
    draft: list[int]
    # Sampled while the row's previous token was still in flight (a constrained row that
    # runs free): the PRNG key it used, to restore if the draw is taken back.
    ahead_key: object = None

    @property
    def taken_back(self) -> bool:
        """Drawn ahead, unmasked, but the token before it ended the free text: drawn again."""
        return self.ahead_key is not None and not self.seq.runs_free


@dataclass
class Begun:
    """A step whose forward pass is built (maybe queued) and whose rows are not sampled yet."""

    slots: list[Slot]
    logits: mx.array | None  # None: no row samples this step
    drafts: dict  # row id -> drafted tokens fed after its input
    later: dict  # row id -> its mask after each draft token
    forced_before: dict  # row id -> len(pending) when fed: more later means forced tokens came
    prefill_tokens: int
    started: float  # when building it began: MLX compiles a kernel new to this machine while queueing it


@dataclass
class Launched:
    """A step queued on the device whose tokens are not read yet."""

    slots: list[Slot]
    samplers: list[Verify]
    sampled: Sampled | None
    prefill_tokens: int = 0  # prompt tokens this step reads
    emitted: int = 0  # tokens handed to sequences, set by `process`
    drafted: int = 0  # draft tokens verified, and how many were kept (set by `process`)
    accepted: int = 0
    taken_back: int = 0  # tokens sampled ahead unmasked, then dropped (set by `process`)
    started: float = field(default_factory=time.perf_counter)


def _row_sampling(seq: Sequence, mask, key, draft: int = -1) -> RowSampling:
    p = seq.request.sampling
    top = p.top_logprobs if p.logprobs else -1
    return RowSampling(p.temperature, p.top_p, p.top_k, p.min_p, key, mask, top, draft)


def _fail(seq: Sequence, exc: BaseException) -> None:
    seq.finish("error", f"{type(exc).__name__}: {exc}")


def _constrained_draft(seq: Sequence, draft: list[int]) -> tuple[list[int], list]:
    """The part of `draft` the row's automaton allows, and its mask after each kept token.

    Stops after a token from which the automaton forces tokens or completes: the engine
    appends those itself, so nothing drafted past them could be kept.
    """
    if seq.constraint is None:
        return draft, [None] * len(draft)
    fork = seq.constraint.fork() if draft else None
    if fork is None:
        return [], []
    kept, masks = [], []
    for token in draft:
        try:
            fork.accept(token)
        except ValueError:
            break
        kept.append(token)
        masks.append(fork.mask())
        if fork.is_complete() or fork.forced_tokens():
            break
    return kept, masks


def _batch_order(slots: list[Slot], drafts: dict) -> list[Slot]:
    """Rows decoding one token from the decode batch first, in slot order (the forward pass's
    own order), then the rest as given: this step's draws then line up with the next step's
    rows, which take them back as one whole array instead of a gather."""
    def key(slot: Slot) -> tuple[int, int]:
        kv = slot.seq.kv
        batched = slot.n == 1 and kv.resident and not drafts.get(slot.seq.id)
        return (0, kv.slot) if batched else (1, 0)

    return sorted(slots, key=key)


# A profiling hook: called as profile(phase, seconds) after each timed part of a step: "launch"
# (begin + finish), "forward" (building the pass), "sample" (building the sampling),
# "async_eval" (MLX queuing work), "wait" (for the step's tokens on the device), "process".
Profile = Callable[[str, float], None]

# The gap clock's phase for building a pass where that runs it (see `StepRunner._forward`).
RUN_AS_BUILT = "pass run as built"


class StepRunner:
    """Launches and processes steps for one model."""

    def __init__(self, model, on_cache_point=None, speculate_max_rows: int = 0,
                 choices: ForwardChoices = ForwardChoices()):
        self.model = model
        # Called as on_cache_point(seq, n_tokens) once the KV of a prompt prefix is built.
        self.on_cache_point = on_cache_point
        self.speculate_max_rows = speculate_max_rows
        self.choices = choices  # which kernels and compiled graphs the forward pass uses
        # Compiled per-layer graphs for short passes; the engine drops them when it stops.
        self.compiled = CompiledBlocks()
        # Only the ragged pass takes last step's token rows as they are; the per-row one needs arrays.
        self.ragged = supports_ragged(model)
        # Set before the engine starts, for benchmarks: `Profile` above; and a callable that sees
        # every graph the runner queues (the arguments of `mx.async_eval`) before it is queued.
        self.profile: Profile | None = None
        self.on_queue: Callable[..., None] | None = None
        # The engine's gap clock: MLX queuing a pass (allocating, encoding, cuDNN/cuBLAS plans) is
        # marked "queue", apart from Python building it ("build") and, on the CPU, building that runs
        # the pass (RUN_AS_BUILT), so a long gap says which held it.
        self.gaps = None

    def _timed(self, phase: str, fn, *args):
        """fn(*args), its time handed to the profiling hook when one is set."""
        if self.profile is None:
            return fn(*args)
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.profile(phase, time.perf_counter() - start)

    def _queue(self, *arrays) -> None:
        """Queue `arrays`' graph on the device (mx.async_eval), shown to `on_queue` first."""
        if self.on_queue is not None:
            self.on_queue(*arrays)
        if self.gaps is None:
            self._timed("async_eval", mx.async_eval, *arrays)
            return
        self.gaps.mark("build")
        before = reserved_bytes()
        self._timed("async_eval", mx.async_eval, *arrays)
        self.gaps.queued(before)

    def _forward(self, rows: list[RowInput]) -> mx.array:
        """The pass's logits. Where attention's softmax runs on the host (the CPU), building the
        pass runs most of it (each layer's scores are evaluated), so the gap clock marks that
        time "pass run as built" rather than "build"."""
        on_host = self.gaps is not None and SOFTMAX_ON_HOST
        if on_host:
            self.gaps.mark("build")
        logits = self._timed("forward", forward, self.model, rows, self.compiled, self.choices)
        if on_host:
            self.gaps.mark(RUN_AS_BUILT)
        return logits

    def _draft(self, seq: Sequence, decoding: int) -> list[int]:
        """Prompt-lookup draft for a row whose tokens are all known, [] when it should not draft."""
        if seq.spec is None or seq.inflight or seq.prefilling or decoding > self.speculate_max_rows:
            return []
        room = seq.request.sampling.max_tokens - len(seq.generated) - 1
        return seq.spec.draft(room)

    def _drafts(self, slots: list[Slot]) -> tuple[dict, dict]:
        """Each sampled row's draft, and its masks after each draft token (known before the
        pass: only a row with nothing in flight drafts, so its automaton is current)."""
        drafts, later = {}, {}
        decoding = sum(1 for s in slots if s.sample and not s.seq.prefilling)
        for slot in slots:
            seq = slot.seq
            if not slot.sample:
                continue
            try:
                drafts[seq.id], later[seq.id] = _constrained_draft(seq, self._draft(seq, decoding))
            except Exception as exc:  # a broken constraint fails its own request only
                _fail(seq, exc)
        return drafts, later

    def launch(self, slots: list[Slot]) -> Launched | None:
        """Queue the forward pass and sampling for `slots`; None when no row is left."""
        return self._timed("launch", self._launch, slots)

    def _launch(self, slots: list[Slot]) -> Launched | None:
        begun = self.begin(slots)
        return self.finish(begun) if begun is not None else None

    def begin(self, slots: list[Slot], queue: bool = False) -> Begun | None:
        """Build the forward pass for `slots` (queued on the device when `queue`, so a step
        can run while the one before is read); `finish` samples it. None when no row is left."""
        started = time.perf_counter()
        drafts, later = self._drafts(slots)
        slots = _batch_order([s for s in slots if not s.seq.finished], drafts)
        if not slots:
            return None
        rows, before, forced_before = [], {}, {}
        for slot in slots:
            seq, draft = slot.seq, drafts.get(slot.seq.id, [])
            before[seq.id] = seq.kv.offset
            tokens = seq.take_input(slot.n)
            forced_before[seq.id] = len(seq.pending)
            if draft:
                tokens = mx.concatenate([as_array(tokens), mx.array(draft, dtype=mx.int32)])
            elif not self.ragged:
                tokens = as_array(tokens)
            rows.append(RowInput(tokens, slot.n + len(draft), seq.kv, slot.sample, len(draft) + 1))
        logits = self._forward(rows)
        sampled_rows = any(s.sample for s in slots)
        queued = queue or not sampled_rows
        if queued:
            self._queue([logits] if sampled_rows else [a for r in rows for a in r.kv.arrays()])
        self._cache_points(slots, before, None if queued else logits)
        prefill_tokens = sum(s.n for s in slots if s.seq.prefilling)
        return Begun(slots, logits if sampled_rows else None, drafts, later, forced_before, prefill_tokens, started)

    def finish(self, begun: Begun) -> Launched:
        """Sample a begun step with each row's mask as it is now, and queue the draws. A row
        that finished, or got forced tokens, since `begin` is not sampled: its draw is dropped."""
        if begun.logits is None:
            return Launched(begun.slots, [], None, begun.prefill_tokens, started=begun.started)
        masks, skip = {}, set()
        for slot in begun.slots:
            seq = slot.seq
            if not slot.sample:
                continue
            try:
                if seq.finished or len(seq.pending) > begun.forced_before[seq.id]:
                    skip.add(seq.id)
                first = seq.constraint.mask() if seq.constraint is not None and seq.id not in skip else None
            except Exception as exc:  # a broken constraint fails its own request only
                _fail(seq, exc)
                skip.add(seq.id)
                first = None
            masks[seq.id] = [first, *begun.later.get(seq.id, [])]
        seqs = [s.seq for s in begun.slots if s.sample]
        verify, sampling = self._sample_rows(seqs, masks, begun.drafts, skip)
        sampled = self._timed("sample", sample, begun.logits, sampling)
        for v in verify:
            seq = v.seq
            if not v.draft:  # fed next step straight from the device, as rows of the batch's arrays
                seq.lazy = RowOf(sampled.tokens, v.start)
                seq.key = RowOf(sampled.keys, v.start)
            seq.sampled_steps += 1
            seq.inflight += 1
        self._queue(sampled.arrays())
        return Launched(begun.slots, verify, sampled, begun.prefill_tokens, started=begun.started)

    def _sample_rows(self, seqs: list[Sequence], masks: dict, drafts: dict,
                     skip: set = frozenset()) -> tuple[list[Verify], list[RowSampling]]:
        """Each row's span of the draws, and one RowSampling per verified position (a row in
        `skip` keeps its places in the logits with unmasked draws nobody reads)."""
        verify, rows = [], []
        for seq in seqs:
            draft = drafts.get(seq.id, [])
            if seq.id in skip:
                rows.extend(_row_sampling(seq, None, seq.key) for _ in range(len(draft) + 1))
                continue
            if draft:  # one key per position; the row's own key moves on once
                key = seq.key.value() if isinstance(seq.key, RowOf) else seq.key
                keys = mx.random.split(key, len(draft) + 2)
                seq.key, position_keys = RowOf(keys, 0), [RowOf(keys, i + 1) for i in range(len(draft) + 1)]
            else:
                position_keys = [seq.key]
            ahead = seq.constraint is not None and seq.inflight > 0
            verify.append(Verify(seq, len(rows), draft, seq.key if ahead else None))
            for i, key in enumerate(position_keys):
                token = draft[i] if i < len(draft) else -1
                rows.append(_row_sampling(seq, masks[seq.id][i], key, token))
        return verify, rows

    def _cache_points(self, slots: list[Slot], before: dict[str, int], unqueued: mx.array | None) -> None:
        """Hand each cache point the pass reached to `on_cache_point` (which snapshots the KV).
        `unqueued`: the pass's logits when not queued yet; queued before the first snapshot, whose
        copy would otherwise run first and miss what a whole step's head kernel writes into the
        decode batch's cache without MLX seeing it (kernels/headprep.py `into_cache`)."""
        if self.on_cache_point is None:
            return
        for slot in slots:
            seq = slot.seq
            while seq.cache_points and seq.cache_points[0] <= seq.kv.offset:
                point = seq.cache_points.pop(0)
                if point > before[seq.id]:
                    if unqueued is not None:
                        self._queue(unqueued)
                        unqueued = None
                    self.on_cache_point(seq, point)

    def process(self, step: Launched) -> list[Sequence]:
        """Read the step's tokens and hand them to their sequences; returns those that got their first token."""
        if step.sampled is None:
            return []
        if self.profile is not None:  # the device's part apart from reading the tokens
            self._timed("wait", mx.eval, step.sampled.tokens)
        return self._timed("process", self._process, step)

    def _process(self, step: Launched) -> list[Sequence]:
        s = step.sampled
        tokens = s.tokens.tolist()
        logprobs = s.logprobs.tolist() if s.logprobs is not None else None
        top_ids = s.top_ids.tolist() if s.top_ids is not None else None
        top_lps = s.top_logprobs.tolist() if s.top_logprobs is not None else None

        def logprob(seq: Sequence, i: int) -> TokenLogprob | None:
            if logprobs is None or not seq.request.sampling.logprobs:
                return None
            k = seq.request.sampling.top_logprobs
            top = list(zip(top_ids[i][:k], top_lps[i][:k])) if top_ids is not None and k else []
            return TokenLogprob(tokens[i], logprobs[i], top)

        first = []
        for v in step.samplers:
            seq = v.seq
            seq.inflight -= 1
            if seq.finished:
                continue
            was_first = seq.first_token_at is None
            try:
                if v.taken_back:
                    seq.take_back(v.ahead_key)  # its previous token started a call: sample again, masked
                    step.taken_back += 1
                    continue
                emitted = _emit(v, tokens, logprob)
                step.emitted += emitted
                if v.draft:
                    step.drafted += len(v.draft)
                    step.accepted += emitted - 1
            except Exception as exc:  # constraint / guard / stop logic of one request
                _fail(seq, exc)
            if was_first:
                first.append(seq)
        return first


def _emit(v: Verify, tokens: list[int], logprob) -> int:
    """Hand a row its sampled token, or the longest verified part of its draft plus the
    model's own next token; drops the rejected draft's KV. Returns the tokens emitted."""
    seq, draft = v.seq, v.draft
    emitted = 0
    for i in range(len(draft) + 1):
        token = tokens[v.start + i]
        seq.on_sampled(token, logprob(seq, v.start + i))
        emitted += 1
        # Past a mismatch the draft's later positions saw a token the model did not choose.
        if seq.finished or seq.pending or i == len(draft) or token != draft[i]:
            break
    if draft:
        accepted = emitted - 1  # draft tokens whose KV is kept: each equals the token emitted before it
        seq.kv.trim(len(draft) - accepted)
        if not seq.finished:
            seq.pending.insert(0, tokens[v.start + emitted - 1])
    seq.after_step(len(draft), emitted - 1 if draft else 0)
    return emitted
