"""Replies keep the tokens they were generated as (locals/server/reply_tokens.py): a conversation
sent back continues the cached tokens through the reply, even where the reply's text would
tokenize otherwise; on a scripted engine and on the embedded model's engine."""

from __future__ import annotations

import pytest

from locals.engine.engine import Engine
from locals.engine.load.templates import cache_points, render_prompt
from locals.engine.settings import EngineConfig
from locals.server.backend import Backend, Chat
from locals.server.reply_tokens import ReplyTokens
from locals.server.typed_controls import encode_spans

from tests.helpers.server_fakes import CharTokenizer, Constraints, FakeLoaded, ScriptedEngine, render

PAIR = 1_000_000  # a pair token: PAIR + 1000 * ord(a) + ord(b), a spelling the encoder never makes


class PairTokenizer(CharTokenizer):
    def decode(self, ids):
        return "".join(chr((i - PAIR) // 1000) + chr((i - PAIR) % 1000) if i >= PAIR else chr(i) for i in ids)


def pairs(text: str) -> list[int]:
    """`text` two characters a token (an odd one out alone)."""
    return [PAIR + 1000 * ord(text[i]) + ord(text[i + 1]) if i + 1 < len(text) else ord(text[i])
            for i in range(0, len(text), 2)]


class PairEngine(ScriptedEngine):
    """Scripted replies streamed as pair tokens (3 characters an event, as ScriptedEngine's)."""

    async def stream(self, request):
        async for event in super().stream(request):
            if hasattr(event, "tokens"):
                event.tokens = pairs(event.text)
            yield event


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_a_remembered_reply_is_spelled_with_its_own_tokens_wherever_the_prompt_holds_it():
    replies = ReplyTokens(keep=2)
    reply = "The answer is in parse.py, line 12."
    replies.remember(reply, pairs(reply), PairTokenizer().decode)
    text = f"user: where?\nassistant: {reply}\nuser: thanks\nassistant:"
    own = replies.tokens(reply)
    tokens = encode_spans(text, [(reply, own)], encode)
    at = len("user: where?\nassistant: ")
    assert tokens == encode(text[:at]) + list(own) + encode(text[at + len(reply):])
    assert replies.tokens("another reply of some length") is None  # not remembered
    assert encode_spans(text, [], encode) == encode(text)
    assert encode_spans(text, [("a reply the text does not hold", [7])], encode) == encode(text)


def test_only_tokens_that_write_the_text_are_kept_and_the_oldest_go_first():
    decode = PairTokenizer().decode
    replies = ReplyTokens(keep=2)
    first, second, third = "first reply, long enough", "second reply, long enough", "third reply, long enough"
    replies.remember(first, pairs(first) + [0], decode)  # an end-of-turn token the text does not show: dropped
    assert replies._by_text[first] == tuple(pairs(first))
    replies.remember(second, pairs("something else entirely!!"), decode)  # not its text: not kept
    replies.remember("short", encode("short"), decode)  # too short to be worth it
    assert list(replies._by_text) == [first]
    spaced = "a reply whose first token had a space"
    replies.remember(spaced, encode(" " + spaced), decode)  # the stream dropped it; the model wrote it
    assert replies._by_text[spaced] == tuple(encode(" " + spaced))
    replies._by_text.pop(spaced)
    replies.remember(second, encode(second), decode)
    replies.remember(third, encode(third), decode)
    assert list(replies._by_text) == [second, third]


class PairLoaded(FakeLoaded):
    tokenizer = PairTokenizer()


async def test_the_next_turn_continues_the_replys_own_tokens():
    reply = "Paris is the capital city of France."
    engine = PairEngine([reply, "Yes."])
    backend = Backend(PairLoaded(), engine, render=render, constrain=Constraints(),
                      boundaries=lambda loaded, messages, tools, tokens, encode=None: [])
    first = [{"role": "user", "content": "Capital of France?"}]
    done = await backend.complete(Chat(api="openai", messages=first))
    assert done.text == reply
    second = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Sure?"}]
    await backend.complete(Chat(api="openai", messages=second))
    prompt = engine.requests[1].prompt_tokens
    head = render(None, first).__len__() + 1  # the first prompt, then the template's space before the reply
    assert prompt[:head] == encode(render(None, first) + " ")
    generated = [t for i in range(0, len(reply), 3) for t in pairs(reply[i:i + 3])]
    assert prompt[head:head + len(generated)] == generated  # what the model generated, not re-encoded
    assert PairTokenizer().decode(prompt) == render(None, second)


@pytest.mark.model
def test_on_the_embedded_model_a_reply_spelled_otherwise_keeps_its_tokens_and_cache_points(smollm2):
    backend = Backend(smollm2, Engine(smollm2, EngineConfig(prefix_cache_bytes=0)))  # not started: no generation
    tok = smollm2.tokenizer
    reply = "Run the tests with pytest, then read the first failure."
    spelled = [i for ch in reply for i in tok.encode(ch, add_special_tokens=False)]  # one character at a time
    assert tok.decode(spelled) == reply and spelled != tok.encode(reply, add_special_tokens=False)
    backend._replies.remember(reply, spelled, tok.decode)
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "How?"},
                {"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
    tokens = backend.encode_chat(messages)
    before = tok.encode(render_prompt(smollm2, messages[:2]), add_special_tokens=False)
    assert tokens[:len(before)] == before  # the previous turn's prompt, as the cache holds it
    assert tokens[len(before):len(before) + len(spelled)] == spelled
    assert tok.decode(tokens) == render_prompt(smollm2, messages)
    points = cache_points(smollm2, messages, None, tokens, encode=lambda text: backend.encode_text(text, messages))
    assert len(points) == 2 and points[-1] > len(before) + len(spelled)  # before the last message: past the reply
    assert len(cache_points(smollm2, messages, None, tokens)) == 1  # re-encoded, that boundary is lost
