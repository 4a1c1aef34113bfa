"""The pieces a generated section is made of: a Markdown table, a figure reference with its
caption, the "not measured yet" line, and the Section that carries them and its files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from paper.results import DEVICE_LABEL, Result


@dataclass
class Section:
    """One generated block of the paper: its Markdown, the files it read and its figures."""

    name: str
    files: list[Result] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    # figure file name -> function that draws it at a path
    figures: dict[str, Callable[[Path], None]] = field(default_factory=dict)

    @property
    def markdown(self) -> str:
        return "\n\n".join(self.parts) + "\n"

    def use(self, files: list[Result]) -> None:
        for f in files:
            if f not in self.files:
                self.files.append(f)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def figure(prefix: str, name: str, alt: str, caption: str) -> str:
    return f"![{alt}]({prefix}{name})\n\n*Figure: {caption}*"


def not_measured(benchmark: str, device: str, how: str) -> str:
    """The line a section shows for a device with no result file yet."""
    return (f"*{DEVICE_LABEL[device]}: not measured yet* (no `benchmarks/results/{benchmark}-{device}-*.json`"
            f" when this was generated; `{how}` writes one).")
