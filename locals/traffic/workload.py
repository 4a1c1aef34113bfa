"""Agent-shaped traffic, planned from a seed before any server runs, so every server in a round
gets the same conversations: N agents with staggered starts share one long system prompt, each
turn adds a message of varied length, asks for a reply of varied length, and is followed by
"tool time" (the agent running a tool) before the next turn. Half the agents offer tools, on
every turn of theirs, as agent tools do: the tool list belongs to a conversation's fixed prefix,
so changing it between turns would make each turn re-read the whole conversation. After the
conversations, a burst: every agent asks for one long reply at the same moment.

Text is words that common tokenizers (SmolLM2's, the benchmark's random model's) encode as one
token each, so a message of n words is about n tokens; servers report the exact counts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

WORDS = tuple("""
the of and to in is that for it as with was on be by at this are from or an have not which but
all were when we there can been has more one will would their what so if about out up them into
some other could time these two may then do first any my now such like our over only even most
made after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see men work
long here get both between life being under never day same another know while last might us great
old year off come since against go came right used take three code file function test value
error build server request return change line module class type call check read write list string
number name path data model token cache step batch memory update result output input option
command project agent tool query table report field index entry event stream start stop open close
load save run find fix add remove keep send reply plan note case rule part form point order system
process group level user object method source target branch commit review issue patch config
setting version package import export handle parse format print debug trace limit count size length
width height depth speed rate score task job queue thread lock signal timer clock date hour minute
second window screen image color block chain node edge graph tree root leaf map set key word text
page book story river ocean mountain forest city street house garden kitchen chair door paper
letter market money price water light sound music voice game team player
""".split())

TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {arg: {"type": "string"} for arg in args},
                       "required": list(args)}}}
    for name, description, args in (
        ("read_file", "Read a file of the project.", ("path",)),
        ("edit_file", "Replace text in a file.", ("path", "old", "new")),
        ("run_command", "Run a shell command in the project folder.", ("command",)),
        ("search", "Search the project for a regular expression.", ("pattern",)),
    )
]

ASK = " Explain what this shows in detail, step by step, then list the next steps at length."


@dataclass(frozen=True)
class Workload:
    """What the agents do. Token counts are (low, high) ranges drawn per turn; `size_scale`
    multiplies every token count and `time_scale` every pause (the stagger of starts and the
    tool time), so a quick run keeps the traffic's shape."""

    turns: int = 3
    system_tokens: tuple[int, int] = (2000, 4000)
    turn_tokens: tuple[int, int] = (100, 1500)
    reply_tokens: tuple[int, int] = (50, 400)
    tool_time_s: tuple[float, float] = (0.0, 10.0)
    stagger_s: float = 10.0  # the last agent starts this long after the first
    burst_turn_tokens: int = 100
    burst_reply_tokens: int = 256
    size_scale: float = 1.0
    time_scale: float = 1.0

    def scaled(self) -> "Workload":
        """The same traffic with every size and pause multiplied out (and scales back to 1)."""
        def tokens(pair):
            return tuple(max(1, round(n * self.size_scale)) for n in pair)

        return replace(self, system_tokens=tokens(self.system_tokens), turn_tokens=tokens(self.turn_tokens),
                       reply_tokens=tokens(self.reply_tokens),
                       tool_time_s=tuple(t * self.time_scale for t in self.tool_time_s),
                       stagger_s=self.stagger_s * self.time_scale,
                       burst_turn_tokens=max(1, round(self.burst_turn_tokens * self.size_scale)),
                       burst_reply_tokens=max(1, round(self.burst_reply_tokens * self.size_scale)),
                       size_scale=1.0, time_scale=1.0)


@dataclass(frozen=True)
class Turn:
    """One request of an agent: the message it adds, the reply length it asks for, and the
    tool time that follows the reply (0 in the burst)."""

    text: str
    max_tokens: int
    tool_time_s: float


@dataclass(frozen=True)
class AgentPlan:
    index: int
    start_s: float  # after the phase starts
    system: str
    offers_tools: bool
    turns: tuple[Turn, ...]
    burst: Turn


def words(rng: random.Random, n: int) -> str:
    """n words, about n tokens."""
    return " ".join(rng.choices(WORDS, k=n))


def plan_agents(agents: int, workload: Workload, seed: int, nonce: str = "") -> list[AgentPlan]:
    """Every agent's conversation for one phase. Same seed, same plan; `nonce` opens the system
    prompt so prompts a server kept on disk from an earlier run are not found again."""
    w = workload.scaled()
    shared = random.Random(f"system:{seed}")
    system = (f"Session {nonce}. You are a coding agent working in a large project. "
              + words(shared, shared.randint(*w.system_tokens)))
    plans = []
    for i in range(agents):
        rng = random.Random(f"agent:{seed}:{i}")
        turns = tuple(Turn(f"Agent {i}, turn {t}: " + words(rng, rng.randint(*w.turn_tokens)) + ASK,
                           rng.randint(*w.reply_tokens),
                           rng.uniform(*w.tool_time_s) if t < w.turns - 1 else 0.0)
                      for t in range(w.turns))
        burst = Turn(f"Agent {i}, last turn: " + words(rng, w.burst_turn_tokens) + ASK, w.burst_reply_tokens, 0.0)
        start = w.stagger_s * i / max(agents - 1, 1)
        plans.append(AgentPlan(i, start, system, offers_tools=i % 2 == 0, turns=turns, burst=burst))
    return plans
