"""Generated sections for the engine: batch decode against mlx-lm, a long prompt arriving
while streams decode, and prompt-lookup drafts on a file rewrite.

Each function takes result files (all of them, or just the ones a paper block names) and
returns a Section; which files it picks is decided here, from the files alone.
"""

from __future__ import annotations

from functools import partial

from paper import plots
from paper.markdown import Section, figure, not_measured, table
from paper.results import (DEVICE_LABEL, Result, fmt, fmt_range, med, newest_by, of, ratio,
                           source_line)

DEVICES = ("gpu", "cpu")
BATCH_PEERS = {"locals": "locals", "mlx-lm": "mlx-lm", "locals-lookup": "locals + lookup",
               "mlx-lm-dense": "mlx-lm dense"}


def batch_files(files: list[Result]) -> list[Result]:
    """The newest file, then older ones of the same setup only for batch sizes it lacks. The
    setup includes the tuning table's choices (kernels chosen per layer shape and rows): a run
    with another table measured other code paths (no table, or none recorded: the same)."""
    if not files:
        return []
    newest = files[-1]
    setup = lambda r: (r.data.get("model"), r.data.get("tokens"), r.data.get("prompt_len"),  # noqa: E731
                       r.data.get("tuning_choices") or {})
    chosen, seen = [newest], {row["batch"] for row in newest.data["rows"]}
    for older in reversed(files[:-1]):
        extra = {row["batch"] for row in older.data["rows"]} - seen
        if setup(older) == setup(newest) and extra:
            chosen.append(older)
            seen |= extra
    return chosen


def _batch_rows(chosen: list[Result]) -> list[tuple[dict, Result]]:
    rows: dict[int, tuple[dict, Result]] = {}
    for f in chosen:  # newest first: a batch size measured twice keeps the newer row
        for row in f.data["rows"]:
            rows.setdefault(row["batch"], (row, f))
    return [rows[b] for b in sorted(rows)]


def _batch_table(rows: list[tuple[dict, Result]], several_files: bool) -> str:
    peers = [p for p in BATCH_PEERS if any(p in row for row, _ in rows)]
    header = ["B", *[f"{BATCH_PEERS[p]} tok/s" for p in peers], "locals / mlx-lm",
              "TTFT locals / mlx-lm (s)"] + (["file"] if several_files else [])
    body = []
    for row, f in rows:
        tps = {p: row[p]["decode_tps"] for p in peers if p in row}
        ttft = "/".join(fmt(med(row.get(p, {}).get("ttft_s")), 2) for p in ("locals", "mlx-lm"))
        body.append([str(row["batch"]), *[fmt_range(tps.get(p)) for p in peers],
                     ratio(med(tps.get("locals")), med(tps.get("mlx-lm"))), ttft]
                    + ([f"`{f.name}`"] if several_files else []))
    return table(header, body)


def _mlx_settings(result: Result) -> set[str]:
    """MLX environment settings a run changed (not those locals sets itself)."""
    return set(result.mlx_settings())


def batch_decode(results: list[Result], prefix: str = "generated/") -> Section:
    sec, panels = Section("batch_decode"), {}
    for device in DEVICES:
        # Rows of different lengths (--length-spread) are another workload, and runs with MLX's
        # settings changed another setup: not this table's.
        chosen = batch_files([r for r in of(results, "batch_decode", device)
                              if not r.data.get("length_spread") and not _mlx_settings(r)])
        if not chosen:
            sec.parts.append(not_measured("batch_decode", device, "python benchmarks/batch_decode.py"))
            continue
        sec.use(chosen)
        rows, head = _batch_rows(chosen), chosen[0].data
        sec.parts.append(
            f"**Table: batch decode, {DEVICE_LABEL[device]}** — {head.get('model')}; "
            f"{head.get('tokens')} tokens per request after a {head.get('prompt_len')}-token prompt; "
            "decode tok/s of all rows, median (range) over rounds; TTFT median over rows.")
        sec.parts.append(_batch_table(rows, len(chosen) > 1))
        sec.parts.append(source_line(chosen))
        panels[DEVICE_LABEL[device]] = {
            label: ([row["batch"] for row, _ in rows if p in row],
                    [med(row[p]["decode_tps"]) for row, _ in rows if p in row])
            for p, label in BATCH_PEERS.items() if any(p in row for row, _ in rows)}
    if panels:
        sec.figures["batch_decode.png"] = partial(plots.lines_vs_batch, panels=panels,
                                                  ylabel="decode tok/s (all rows)")
        sec.parts.append(figure(prefix, "batch_decode.png", "decode tok/s against batch size",
                                "aggregate decode tok/s against batch size B, locals and mlx-lm's "
                                "BatchGenerator. " + source_line(sec.files)))
    return sec


def long_prompt(results: list[Result], prefix: str = "generated/") -> Section:
    sec, panels, body = Section("long_prompt"), {}, []
    for device in DEVICES:
        files = newest_by(of(results, "long_prompt", device), lambda r: r.data.get("step_token_budget"))
        if not files:
            sec.parts.append(not_measured("long_prompt", device, "python benchmarks/long_prompt.py"))
            continue
        sec.use(files)
        for f in sorted(files, key=lambda r: r.data.get("step_token_budget") or 0):
            ours, peer = f.data["results"]["locals"], f.data["results"]["mlx-lm"]
            budget = f.data.get("step_token_budget")
            body.append([DEVICE_LABEL[device], str(f.data.get("long_tokens")), str(budget),
                         fmt_range(ours["max_gap_s"], 3), fmt_range(peer["max_gap_s"], 3),
                         ratio(med(ours["max_gap_s"]), med(peer["max_gap_s"])),
                         f"{fmt(med(ours['usual_gap_s']), 3)} / {fmt(med(peer['usual_gap_s']), 3)}",
                         f"{fmt(med(ours['ttft_s']), 2)} / {fmt(med(peer['ttft_s']), 2)}", f"`{f.name}`"])
            panels.setdefault(DEVICE_LABEL[device], {})[f"budget {budget}"] = {
                "locals": med(ours["max_gap_s"]), "mlx-lm": med(peer["max_gap_s"])}
    if body:
        sec.parts.insert(0, table(["device", "long prompt (tokens)", "step token budget",
                                   "locals max gap (s)", "mlx-lm max gap (s)", "locals / mlx-lm",
                                   "usual gap locals / mlx-lm (s)", "long TTFT locals / mlx-lm (s)",
                                   "file"], body))
        sec.parts.insert(0, "**Table: a long prompt arriving while 4 streams decode** — the longest gap "
                            "between two tokens of any running stream while the prompt is read, "
                            "median (range) over rounds.")
        sec.parts.append(source_line(sec.files))
        sec.figures["long_prompt.png"] = partial(plots.grouped_bars, panels=panels,
                                                 ylabel="longest stream gap (s)")
        sec.parts.append(figure(prefix, "long_prompt.png", "longest gap of running streams",
                                "longest gap between two tokens of the running streams while a long "
                                "prompt is read. " + source_line(sec.files)))
    return sec


REWRITE_PEERS = {"locals": "locals", "locals-no-lookup": "locals, no drafts", "mlx-lm": "mlx-lm"}


def _rewrite_rows(f: Result, device: str) -> list[list[str]]:
    body = []
    for row in f.data["rows"]:
        tps = {p: row[p]["decode_tps"] for p in REWRITE_PEERS if p in row}
        kept = med(row.get("locals", {}).get("acceptance"))
        body.append([DEVICE_LABEL[device], row["case"], str(row.get("prompt_tokens", "–")),
                     str(f.data.get("tokens")), *[fmt_range(tps.get(p)) for p in REWRITE_PEERS],
                     ratio(med(tps.get("locals")), med(tps.get("mlx-lm")), 1),
                     "–" if kept is None else f"{kept * 100:.0f}%",
                     {True: "yes", False: "no"}.get(row.get("same_output"), "–"), f"`{f.name}`"])
    return body


def rewrite(results: list[Result], prefix: str = "generated/") -> Section:
    sec, panels, body = Section("rewrite"), {}, []
    for device in DEVICES:
        files = of(results, "rewrite", device)[-1:]
        if not files:
            sec.parts.append(not_measured("rewrite", device, "python benchmarks/rewrite.py"))
            continue
        sec.use(files)
        body += _rewrite_rows(files[0], device)
        panels[DEVICE_LABEL[device]] = {
            row["case"]: {label: med(row[p]["decode_tps"]) for p, label in REWRITE_PEERS.items() if p in row}
            for row in files[0].data["rows"]}
    if body:
        sec.parts.insert(0, table(["device", "case", "prompt tokens", "tokens generated",
                                   *[f"{label} tok/s" for label in REWRITE_PEERS.values()],
                                   "locals / mlx-lm", "draft tokens kept", "same greedy output", "file"],
                                  body))
        sec.parts.insert(0, "**Table: prompt-lookup drafts, one greedy request** — embedded SmolLM2-135M, "
                            "the same weights for all three; decode tok/s median (range) over rounds.")
        sec.parts.append(source_line(sec.files))
        sec.figures["rewrite.png"] = partial(plots.grouped_bars, panels=panels, ylabel="decode tok/s")
        sec.parts.append(figure(prefix, "rewrite.png", "decode tok/s with and without drafts",
                                "one request's decode tok/s: locals with prompt-lookup drafts, without "
                                "them, and mlx-lm's stream_generate. " + source_line(sec.files)))
    return sec
