"""JSON-schema string `pattern`s as regexes outlines-core can enforce soundly in a given context.

A pattern is parsed with Python's own regex parser (jsonschema validates with `re`), anchors
at its ends are dropped (the automaton matches the whole value, which is one of the texts an
unanchored search accepts), and it is re-written in outlines-core's syntax with every
character class minus the characters the context cannot carry raw (`"`/`\\`/controls in a
JSON string, `<` in a Qwen3-Coder XML value, which could start `</parameter>`): the result
accepts exactly the pattern's texts without those characters. For XML values the texts
"null" (any case), which mlx-lm's parser reads as None, are removed with derivatives.
Anything else (lookarounds, back-references, inline flags, inner anchors) raises ValueError.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from re import _constants as C
from re import _parser

# Per category: (subset of Python's set, superset of it), in outlines-core (Rust regex) syntax,
# so a positive class never allows what Python rejects and a negated one never excludes too little.
_CATEGORIES = {
    C.CATEGORY_DIGIT: ("0-9", r"\d"),
    C.CATEGORY_NOT_DIGIT: (r"\D", r"\D"),
    C.CATEGORY_WORD: ("0-9A-Za-z_", r"\w"),
    C.CATEGORY_NOT_WORD: (r"\W", "[^0-9A-Za-z_]"),
    C.CATEGORY_SPACE: (r"\t\n\x0B\f\r ", r"\s\x1C-\x1F"),
    C.CATEGORY_NOT_SPACE: (r"[\S&&[^\x1C-\x1F]]", r"[^\t\n\x0B\f\r ]"),
}
_PY_CATEGORY = {C.CATEGORY_DIGIT: r"\d", C.CATEGORY_NOT_DIGIT: r"\D", C.CATEGORY_WORD: r"\w",
                C.CATEGORY_NOT_WORD: r"\W", C.CATEGORY_SPACE: r"\s", C.CATEGORY_NOT_SPACE: r"\S"}
_WORD = "null"  # mlx-lm's qwen3_coder parser: `value.lower() == "null"` -> None

MAX_REPEAT = 10_000  # the most times a pattern may repeat a part (its automaton unrolls them)


def _hex(c: int) -> str:
    return chr(c) if chr(c).isalnum() and c < 128 else f"\\x{{{c:X}}}"


@dataclass(frozen=True)
class Chars:
    """A character class: ranges and categories (negated or not), minus some characters."""

    ranges: tuple[tuple[int, int], ...] = ()
    categories: tuple = ()
    negated: bool = False
    minus: frozenset = frozenset()

    def has(self, ch: str) -> bool:
        inside = any(lo <= ord(ch) <= hi for lo, hi in self.ranges) or any(
            re.fullmatch(_PY_CATEGORY[k], ch) for k in self.categories)
        return inside != self.negated and ch not in self.minus

    def empty(self) -> bool:
        if self.negated or self.categories:
            return False  # categories and complements hold far more than a few removed characters
        return all(sum(1 for m in self.minus if lo <= ord(m) <= hi) == hi - lo + 1 for lo, hi in self.ranges)

    def has_range(self, ch: str) -> bool:
        return any(lo <= ord(ch) <= hi for lo, hi in self.ranges)

    def without(self, chars) -> Chars:
        return Chars(self.ranges, self.categories, self.negated, self.minus | frozenset(chars))

    def regex(self) -> str:
        items = "".join(_hex(lo) + (f"-{_hex(hi)}" if hi > lo else "") for lo, hi in self.ranges)
        items += "".join(_CATEGORIES[k][1 if self.negated else 0] for k in self.categories)
        minus = self.minus if self.negated or self.categories else {m for m in self.minus if self.has_range(m)}
        if not minus and not self.negated and not self.categories and len(self.ranges) == 1 \
                and self.ranges[0][0] == self.ranges[0][1]:
            return _hex(self.ranges[0][0])
        body = f"[^{items}]" if self.negated else f"[{items}]"
        if minus:
            body = f"[{body}&&[^{''.join(_hex(ord(m)) for m in sorted(minus))}]]"
        return body


# The language tree: ("eps",), ("empty",), ("chars", Chars), ("cat", [nodes]), ("alt", [nodes]),
# ("rep", node, low, high or None).
EPS, EMPTY = ("eps",), ("empty",)


def _cat(nodes) -> tuple:
    nodes = [n for n in nodes if n != EPS]
    if EMPTY in nodes:
        return EMPTY
    return EPS if not nodes else nodes[0] if len(nodes) == 1 else ("cat", nodes)


def _alt(nodes) -> tuple:
    out = []
    for n in nodes:
        for m in (n[1] if n[0] == "alt" else [n]):
            if m != EMPTY and m not in out:
                out.append(m)
    return EMPTY if not out else out[0] if len(out) == 1 else ("alt", out)


def _chars(c: Chars) -> tuple:
    return EMPTY if c.empty() else ("chars", c)


def nullable(n) -> bool:
    kind = n[0]
    if kind in ("eps", "empty", "chars"):
        return kind == "eps"
    if kind == "cat":
        return all(map(nullable, n[1]))
    if kind == "alt":
        return any(map(nullable, n[1]))
    return n[2] == 0 or nullable(n[1])


def _first(n, on_chars) -> tuple:
    """The texts of `n` whose first character passes `on_chars` (Chars -> node for the rest)."""
    kind = n[0]
    if kind in ("eps", "empty"):
        return EMPTY
    if kind == "chars":
        return on_chars(n[1])
    if kind == "alt":
        return _alt([_first(m, on_chars) for m in n[1]])
    if kind == "cat":
        head, rest = n[1][0], _cat(n[1][1:])
        return _alt([_cat([_first(head, on_chars), rest]), _first(rest, on_chars) if nullable(head) else EMPTY])
    inner, low, high = n[1], n[2], n[3]
    if high == 0:
        return EMPTY
    more = ("rep", inner, 0 if nullable(inner) else max(low - 1, 0), None if high is None else high - 1)
    return _cat([_first(inner, on_chars), more if more[3] != 0 else EPS])


def derivative(n, ch: str) -> tuple:
    """{w : ch + w in n}."""
    return _first(n, lambda c: EPS if c.has(ch) else EMPTY)


def starting_outside(n, chars: str) -> tuple:
    """The non-empty texts of `n` whose first character is not in `chars`."""
    return _first(n, lambda c: _cat([_chars(c.without(chars)), EPS]) if chars else ("chars", c))


def without_word(n, word: str = _WORD, at: int = 0) -> tuple:
    """`n` minus `word[at:]` in any letter case."""
    if at == len(word):
        return starting_outside(n, "")  # everything but the empty rest
    cases = sorted({word[at].lower(), word[at].upper()})
    parts = [EPS if nullable(n) else EMPTY, starting_outside(n, "".join(cases))]
    for ch in cases:
        rest = without_word(derivative(n, ch), word, at + 1)
        parts.append(_cat([("chars", Chars(ranges=((ord(ch), ord(ch)),))), rest]))
    return _alt(parts)


def regex(n) -> str:
    kind = n[0]
    if kind == "eps":
        return ""
    if kind == "chars":
        return n[1].regex()
    if kind == "cat":
        return "".join(f"({regex(m)})" if m[0] == "alt" else regex(m) for m in n[1])
    if kind == "alt":
        # outlines-core reads an empty branch `(|a)` as "nothing else": write `(a)?` instead.
        rest = [m for m in n[1] if m != EPS]
        body = "(" + "|".join(regex(m) for m in rest) + ")"
        return body + "?" if len(rest) < len(n[1]) else body
    if kind == "rep":
        low, high = n[2], n[3]
        count = f"{{{low},}}" if high is None else f"{{{low}}}" if low == high else f"{{{low},{high}}}"
        return f"({regex(n[1])}){count}"
    raise ValueError("the pattern allows no text")


def _class(items, banned: frozenset) -> Chars:
    ranges, cats, negated = [], [], False
    for op, arg in items:
        if op is C.NEGATE:
            negated = True
        elif op is C.LITERAL:
            ranges.append((arg, arg))
        elif op is C.RANGE:
            ranges.append(arg)
        elif op is C.CATEGORY and arg in _CATEGORIES:
            cats.append(arg)
        else:
            raise ValueError(f"it uses a character class item Python and JSON schema disagree on ({op})")
    return Chars(tuple(ranges), tuple(cats), negated, banned)


def _tree(items, banned: frozenset) -> tuple:
    out = []
    for op, arg in items:
        if op is C.LITERAL:
            out.append(_chars(Chars(((arg, arg),), minus=banned)))
        elif op is C.NOT_LITERAL:
            out.append(_chars(Chars(((arg, arg),), negated=True, minus=banned)))
        elif op is C.ANY:
            out.append(_chars(Chars(((10, 10),), negated=True, minus=banned)))  # `.` is not "\n"
        elif op is C.IN:
            out.append(_chars(_class(arg, banned)))
        elif op is C.BRANCH:
            out.append(_alt([_tree(b, banned) for b in arg[1]]))
        elif op is C.SUBPATTERN:
            if arg[1] or arg[2]:
                raise ValueError("it sets regex flags inside the pattern")
            out.append(_tree(arg[3], banned))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
            low, high, sub = arg
            inner = _tree(sub, banned)
            high = None if high is C.MAXREPEAT else high
            if max(low, high or 0) > MAX_REPEAT:  # unrolled by the automaton: see schema.MAX_BOUND
                raise ValueError(f"it repeats a part {max(low, high or 0)} times, over {MAX_REPEAT:,}")
            out.append(EPS if high == 0 or inner == EPS else
                       (EPS if low == 0 else EMPTY) if inner == EMPTY else ("rep", inner, low, high))
        else:
            raise ValueError(f"it uses {str(op).lower()}, which a regex automaton cannot enforce "
                             "(lookarounds, back-references and anchors inside the pattern)")
    return _cat(out)


def strip_anchors(pattern: str) -> str:
    """The pattern without a leading `^` and an unescaped trailing `$`."""
    if pattern.startswith("^"):
        pattern = pattern[1:]
    if pattern.endswith("$"):
        body = pattern[:-1]
        if (len(body) - len(body.rstrip("\\"))) % 2 == 0:  # an odd run of backslashes escapes it
            pattern = body
    return pattern


def pattern_regex(pattern: str, banned: str = "", *, no_null: bool = False) -> str:
    """outlines-core regex for the texts of `pattern` (JSON-schema semantics, whole value) that
    hold none of `banned` (and, with `no_null`, are not "null" in any case). ValueError says
    why a pattern cannot be enforced."""
    try:
        return _pattern_regex(pattern, banned, no_null)
    except RecursionError:  # Python's regex parser and the tree walk below both recurse per group
        raise ValueError("its pattern nests groups too deeply") from None


def _pattern_regex(pattern: str, banned: str, no_null: bool) -> str:
    if not isinstance(pattern, str):
        raise ValueError("its pattern is not a string")
    try:
        parsed = _parser.parse(strip_anchors(pattern))
    except re.error as exc:
        raise ValueError(f"its pattern is not a valid regex ({exc})") from None
    if parsed.state.flags & ~(re.UNICODE | re.ASCII):
        raise ValueError("it sets regex flags inside the pattern")
    tree = _tree(list(parsed), frozenset(banned))
    spelled = ("".join(t) for t in itertools.product(*({c.lower(), c.upper()} for c in _WORD)))
    if no_null and tree != EMPTY and any(re.fullmatch(strip_anchors(pattern), w) for w in spelled):
        tree = without_word(tree)
        if tree == EMPTY:
            raise ValueError(f"its pattern allows only the text {_WORD!r}, which the parser reads as null")
    if tree == EMPTY:
        raise ValueError(f"its pattern allows no text without {banned!r}" if banned else
                         "its pattern allows no text")
    return regex(tree)


# `^[\s\S]{m,n}$` and its spellings: any characters, a count only (a length limit written as a pattern).
_COUNT_ONLY = re.compile(r"\^\[(\\s\\S|\\S\\s|\\w\\W|\\W\\w|\\d\\D|\\D\\d)\]"
                         r"(?P<count>\*|\+|\{\d+\}|\{\d*,\d*\})\$")
# `^C*$` / `^C+$` for one character class, escape or plain character.
_ONE_CLASS = re.compile(r"\^(?P<atom>\[(?:\\.|[^\]\\])+\]|\\[dDwWsS]|\.|[^\\\[\](){}|*+?.^$])(?P<count>\*|\+)\$")


def intersect_patterns(a: str, b: str, most: int | None = None) -> str | None:
    """One pattern matching what both match, where one only counts characters of any kind and
    the other repeats one character class (`^[^\\n]*$` and `^[\\s\\S]{0,300}$` give
    `^[^\\n]{0,300}$`, as Claude Code's tools write them); None for any other pair. A count whose
    maximum is over `most` keeps only its minimum (as the schema's maxLength over LOOSE_MAXIMA)."""
    for count_only, other in ((a, b), (b, a)):
        limit, one = _COUNT_ONLY.fullmatch(count_only), _ONE_CLASS.fullmatch(other)
        if limit and one:
            count = _loosened(limit.group("count"), most)
            if one.group("count") == "+" and count in ("{0}", "{,0}", "{0,0}"):
                return None  # nothing matches both: refused as before
            if one.group("count") == "+" and count in ("*", "{0,}"):
                count = "+"
            elif one.group("count") == "+" and count.startswith("{0,"):
                count = "{1," + count[3:]
            return f"^{one.group('atom')}{count}$"
    return None


def _loosened(count: str, most: int | None) -> str:
    """`count` (`*`, `+`, `{n}`, `{m,n}`) without a maximum over `most`."""
    bounds = count.strip("{}").split(",") if count.startswith("{") else None
    if most is None or bounds is None or not bounds[-1] or int(bounds[-1]) <= most:
        return count
    low = int(bounds[0] or 0) if len(bounds) == 2 else int(bounds[0])
    return "*" if low == 0 else "+" if low == 1 else f"{{{low},}}"
