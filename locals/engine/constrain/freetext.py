"""Regexes for free text that never contains given closing markers (`</parameter>`, `</tool_call>`).

A tool call's free-text parts (a JSON string, an XML parameter value) must not contain the
marker that ends them, or the parser cuts the call there. Each marker starts with `<` and
holds no other `<`, so after a mismatch the only partial match left is a fresh `<`: text
is a sequence of ordinary characters and `<…` runs that stop before completing a marker.
"""

from __future__ import annotations

import re

# Characters a JSON string holds only escaped (outlines-core's own set, so both agree).
JSON_CONTROL = r'"\\\x00-\x1F\x7F-\x9F'
JSON_ASCII_CONTROL = frozenset('"\\' + "".join(map(chr, range(0x20))) + "\x7f")
JSON_ESCAPE = r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})'
_CLASS_SPECIAL = set("\\]^-[")


def _class_chars(chars) -> str:
    return "".join("\\" + c if c in _CLASS_SPECIAL else c for c in sorted(set(chars)))


def ascii_except(chars) -> str:
    """A class of the ASCII characters not in `chars`, as ranges."""
    keep = [c for c in range(128) if chr(c) not in set(chars)]
    runs, start = [], None
    for i, c in enumerate(keep):
        if start is None:
            start = c
        if i + 1 == len(keep) or keep[i + 1] != c + 1:
            runs.append(f"\\x{start:02X}" + (f"-\\x{c:02X}" if c > start else ""))
            start = None
    return "[" + "".join(runs) + "]"


def _prefixes(words) -> list[str]:
    """Proper prefixes of the markers' tails (after their `<`), shortest first, "" included."""
    tails = []
    for word in words:
        if not word.startswith("<") or "<" in word[1:]:
            raise ValueError(f"marker {word!r} must start with '<' and hold no other '<'")
        tails.append(word[1:])
    return sorted({t[:k] for t in tails for k in range(len(t))}, key=lambda p: (len(p), p))


class Avoiding:
    """Regex pieces for text without `words`: characters outside `excluded` (a regex class body),
    or `escape` sequences. After a `<` the next character must be ASCII: a non-ASCII one there
    would give every partial-marker state its own UTF-8 states (the automaton grows ~3x)."""

    def __init__(self, words, *, excluded: str = "", ascii_excluded=frozenset(), escape: str | None = None):
        self.words = tuple(words)
        self.excluded = excluded
        self.ascii_excluded = frozenset(ascii_excluded)
        self.escape = escape
        prefixes = _prefixes(self.words)
        tails = [w[1:] for w in self.words]
        opens = [re.escape(p) for p in prefixes if p]
        # A `<` run that stops short of every marker; only `<` (a new run) may follow it.
        self.open_unit = "<" + (f"({'|'.join(opens)})?" if opens else "")
        closed = []
        for p in prefixes:
            nexts = {t[len(p)] for t in tails if t.startswith(p) and len(t) > len(p)}
            breaker = self.ascii_except(nexts)
            closed.append(re.escape(p) + (f"({breaker}|{escape})" if escape else breaker))
        # A `<` run ended by a character that continues no marker (back to plain text).
        self.closed_unit = f"(({self.open_unit})*<({'|'.join(closed)}))"
        plain = f"[^<{excluded}]"
        self.plain = f"({plain}|{escape})" if escape else plain
        self.tail = f"({self.open_unit})*"

    def ascii_except(self, chars) -> str:
        return ascii_except(set(chars) | {"<"} | self.ascii_excluded)

    def any(self) -> str:
        """Any text without the markers (possibly empty)."""
        return f"(({self.plain}|{self.closed_unit})*{self.tail})"

    def not_word(self, word: str) -> str:
        """Such text, except `word` in any letter case (mlx-lm's XML parser reads "null" as None).

        Written so that `any()` appears once: text that leaves the word at some character, then
        anything; text that leaves it with a `<` run; or a proper prefix of the word."""
        if self.escape is not None:
            raise ValueError("not_word is for raw text without escapes")
        cases = [f"[{_class_chars(c.lower() + c.upper())}]" for c in word]
        prefixes = ["".join(cases[:i]) for i in range(len(word) + 1)]
        # The first character may be any; after a prefix of the word only ASCII (as after `<`).
        leave = [f"[^<{_class_chars(word[0].lower() + word[0].upper())}{self.excluded}]"]
        leave += [prefixes[i] + self.ascii_except(word[i].lower() + word[i].upper()) for i in range(1, len(word))]
        leave.append(prefixes[-1] + self.ascii_except(""))
        before_lt = "(" + "|".join(prefixes) + ")"
        return (f"(({'|'.join(leave)}|{before_lt}{self.closed_unit}){self.any()}"
                f"|{before_lt}({self.open_unit})+|({'|'.join(prefixes[:-1])}))")

    def not_container(self) -> str:
        """Such text whose first non-blank character is not `[` or `{` (json.loads of it is no container)."""
        first = rf"[^ \t\n\r\[{{<{self.excluded}]"
        return rf"([ \t\n\r]*(({first}|{self.closed_unit}){self.any()}|({self.open_unit})+)?)"


def json_string_body(words) -> str:
    """The inside of a JSON string (between its quotes) that never contains `words` unescaped."""
    return Avoiding(words, excluded=JSON_CONTROL, ascii_excluded=JSON_ASCII_CONTROL, escape=JSON_ESCAPE).any()
