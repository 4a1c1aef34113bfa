"""Matplotlib drawings for the paper's figures (Agg backend, PNG files).

Each function takes plain numbers already read from the result files and writes one PNG;
none of them reads JSON or decides what to show.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"locals": "#1f77b4", "mlx-lm": "#ff7f0e", "locals + lookup": "#2ca02c",
          "mlx-lm dense": "#9467bd", "locals, no drafts": "#8c9fb4", "mlx_lm.server": "#ff7f0e",
          "llama.cpp": "#2ca02c"}


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _panels(n: int, width: float = 5.0, height: float = 3.6):
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(axes[0])


def lines_vs_batch(path: Path, panels: dict[str, dict[str, tuple[list[int], list[float]]]],
                   ylabel: str) -> None:
    """One panel per device: a line per engine of a value against batch size (log2 x axis)."""
    fig, axes = _panels(len(panels))
    for ax, (title, series) in zip(axes, panels.items()):
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", label=label, color=COLORS.get(label))
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({x for xs, _ in series.values() for x in xs}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("batch size B")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    _save(fig, path)


def grouped_bars(path: Path, panels: dict[str, dict[str, dict[str, float]]], ylabel: str,
                 log: bool = False) -> None:
    """One panel per title; in each, groups (outer keys) of bars (inner keys: the series)."""
    fig, axes = _panels(len(panels))
    for ax, (title, groups) in zip(axes, panels.items()):
        names = list(groups)
        series = list(dict.fromkeys(s for bars in groups.values() for s in bars))
        width = 0.8 / max(len(series), 1)
        for i, label in enumerate(series):
            xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(names))]
            ys = [groups[n].get(label, 0.0) for n in names]
            bars = ax.bar(xs, ys, width, label=label, color=COLORS.get(label))
            ax.bar_label(bars, fmt="%.3g", fontsize=7)
        ax.set_xticks(range(len(names)), names)
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    _save(fig, path)


def lines_vs_rows(path: Path, panels: dict[str, dict[str, tuple[list[int], list[float]]]],
                  ylabel: str) -> None:
    """One panel per weight shape: time per call against the number of activation rows M."""
    fig, axes = _panels(len(panels), width=4.2)
    for ax, (title, series) in zip(axes, panels.items()):
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker=".", label=label)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("rows M")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def lines_per_turn(path: Path, series: dict[str, list[float]], title: str) -> None:
    """Time to first token of each turn of one conversation, one line per server (log y)."""
    fig, axes = _panels(1, width=6.0)
    ax = axes[0]
    for label, ys in series.items():
        ax.plot(range(1, len(ys) + 1), ys, marker="o", label=label, color=COLORS.get(label))
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("turn")
    ax.set_ylabel("time to first token (s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)
