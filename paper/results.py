"""Benchmark result files for the paper and docs/benchmarks.md: loading benchmarks/results/*.json,
picking the newest per benchmark and device, and the command that produced each file.

Read-only over the results folder; knows the file naming of benchmarks/common.write_results
(`<benchmark>-<cpu|gpu>-<YYYYmmdd-HHMMSS>.json`), that of `locals bench --out DIR`
(`bench-<YYYYmmdd-HHMMSS>.json`, a served-traffic report naming its backend) and nothing about
any one benchmark's table.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from locals.engine.load.backend import CUDA_GRAPH_CACHE

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
NAME = re.compile(r"^(?P<benchmark>[a-z0-9_]+)-(?P<device>cpu|gpu)-(?P<stamp>\d{8}-\d{6})\.json$")
BENCH_NAME = re.compile(r"^bench-(?P<stamp>\d{8}-\d{6})\.json$")
# `locals bench` reports of this kind are results; its `--engine` reports are not kept here.
BENCH_KIND = "serve_traffic"
# Options that say where a report was written, not what was measured (and name a path on the
# measuring machine): left out of the command shown.
OUTPUT_FLAGS = ("--out", "-o")
DEVICE_LABEL = {"gpu": "H200", "cpu": "CPU (2 shared x86 cores)"}
GPU_LABELS = ("H100", "H200")  # as results' device names contain them

# Scripts that do not record their argv: the top-level JSON keys that are their flags' values.
RECORDED_FLAGS = {
    "kernels": ("rounds", "repeats", "bits", "group_size", "dtype"),
    "constraint": ("model", "batch"),
}


@dataclass(frozen=True)
class Result:
    """One benchmark result file."""

    path: Path
    data: dict

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def from_cli(self) -> bool:
        """Written by `locals bench`, not by a script in benchmarks/."""
        return bool(BENCH_NAME.match(self.name))

    @property
    def benchmark(self) -> str:
        return BENCH_KIND if self.from_cli else NAME.match(self.name)["benchmark"]

    @property
    def device(self) -> str:
        if self.from_cli:
            return "cpu" if self.data.get("backend") == "cpu" else "gpu"
        return NAME.match(self.name)["device"]

    @property
    def label(self) -> str:
        """The machine as tables name it: the GPU the result records (H100, H200; GPU results
        from before they recorded one ran on an H200), else `DEVICE_LABEL`'s."""
        if self.device != "gpu":
            return DEVICE_LABEL[self.device]
        machine = self.data.get("machine")
        name = self.data.get("device_name") or (
            (machine.get("device_info") or {}).get("device_name", "") if isinstance(machine, dict) else "")
        return next((gpu for gpu in GPU_LABELS if gpu in (name or "")), DEVICE_LABEL["gpu"])

    @property
    def stamp(self) -> str:
        return (BENCH_NAME.match(self.name) or NAME.match(self.name))["stamp"]

    @property
    def date(self) -> str:
        """When the run started, `YYYY-mm-dd HH:MM`, from the file's name."""
        s = self.stamp
        return f"{s[:4]}-{s[4:6]}-{s[6:8]} {s[9:11]}:{s[11:13]}"

    def mlx_settings(self) -> dict[str, str]:
        """The MLX environment settings the run chose: not those locals sets itself (its kernel
        folder, and its CUDA graph cache where the run left it at locals' size)."""
        return {k: v for k, v in (self.data.get("mlx_env") or {}).items()
                if k != "MLX_PTX_CACHE_DIR" and (k, v) != ("MLX_CUDA_GRAPH_CACHE_SIZE", str(CUDA_GRAPH_CACHE))}

    def command(self) -> str:
        """The command line that wrote this file, as exactly as the file records it (less where
        its output went)."""
        if self.from_cli:
            return " ".join(["locals", *map(shlex.quote, _without_output(self.data.get("command", [])))])
        script = f"python benchmarks/{self.benchmark}.py"
        if isinstance(self.data.get("command"), list):  # a served-traffic report: its argv, so named
            return " ".join([script, *map(shlex.quote, _without_output(self.data["command"]))]).strip()
        if "argv" in self.data:  # with the MLX settings the run changed
            env = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.mlx_settings().items())]
            return " ".join([*env, script, *map(shlex.quote, _without_output(self.data["argv"]))]).strip()
        if isinstance(self.data.get("args"), dict):
            return " ".join([script, *_flags(self.data["args"])])
        recorded = {k: self.data[k] for k in RECORDED_FLAGS.get(self.benchmark, ()) if k in self.data}
        return " ".join([script, *_flags(recorded)])

    def command_note(self) -> str:
        """How `command()` was recovered: from argv, or rebuilt from recorded parameters."""
        if "argv" in self.data or isinstance(self.data.get("command"), list):
            return ""
        return " (the file records no argv; flags rebuilt from the parameters it records)"


def _without_output(argv: list[str]) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token in OUTPUT_FLAGS:
            skip = True
        elif token.startswith("/"):  # a file on the measuring machine: its name says what it was
            out.append(token.rsplit("/", 1)[-1])
        elif not token.startswith(tuple(f"{flag}=" for flag in OUTPUT_FLAGS)):
            out.append(token)
    return out


def _flags(values: dict) -> list[str]:
    """argparse-style flags for a dict of option values (None skipped, True as a bare flag)."""
    out = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
            continue
        text = str(value).removeprefix("mlx.core.")
        out += [flag, shlex.quote(text)]
    return out


def load_results(folder: Path = RESULTS, names: list[str] | None = None) -> list[Result]:
    """Every well-named result file in `folder` (or just `names`), oldest first."""
    paths = [folder / n for n in names] if names is not None else sorted(folder.glob("*.json"))
    found = [Result(p, json.loads(p.read_text())) for p in paths if NAME.match(p.name) or BENCH_NAME.match(p.name)]
    found = [r for r in found if not r.from_cli or r.data.get("benchmark") == BENCH_KIND]
    return sorted(found, key=lambda r: r.stamp)


def of(results: list[Result], benchmark: str, device: str | None = None) -> list[Result]:
    """The files of one benchmark (and device), oldest first."""
    return [r for r in results if r.benchmark == benchmark and (device is None or r.device == device)]


def newest_by(results: list[Result], key) -> list[Result]:
    """The newest file for each value of key(result), in order of that key's first appearance."""
    best: dict = {}
    for r in results:
        best[key(r)] = r
    return list(best.values())


def source_line(results: list[Result]) -> str:
    """A caption line naming each file and the command that wrote it."""
    parts = [f"`{r.name}` from `{r.command()}`{r.command_note()}" for r in results]
    return "Source: " + "; ".join(parts) + "."


def med(summary: dict | None) -> float | None:
    return None if not summary else summary["median"]


def fmt(value: float | None, digits: int = 1, unit: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{unit}"


def fmt_range(summary: dict | None, digits: int = 1) -> str:
    """`median (min–max)`, or the median alone when there was one sample."""
    if not summary:
        return "–"
    text = fmt(summary["median"], digits)
    if summary.get("n", 1) > 1 and summary["min"] != summary["max"]:
        text += f" ({summary['min']:.{digits}f}–{summary['max']:.{digits}f})"
    return text


def ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    return "–" if a is None or not b else f"{a / b:.{digits}f}×"
