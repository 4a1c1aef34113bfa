"""The paper's build and the traceability of measured numbers: make_figures renders every
table and figure from the repository's results, the paper's generated blocks are exactly
what their named files give, and every result file and benchmark command that README.md,
docs/ and paper/ mention exists (with the flags the script accepts)."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

from paper import make_figures
from paper.results import RESULTS

from tests.helpers.repo import REPO

JSON_NAME = re.compile(r"[\w-]+-(?:cpu|gpu)-\d{8}-\d{6}\.json")
SCRIPT = re.compile(r"benchmarks/(\w+\.(?:py|sh))\b")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
SEPARATORS = {"|", "||", "&&", ";", ">", "2>&1"}
# A measured value in prose: a decimal (or a percentage) with its unit.
MEASURE = re.compile(r"(?<![\w.])(\d+\.\d+|\d+(?=%))\s?(?:×|%|s\b|ms\b|µs\b|tok/s)")


def documents() -> list[Path]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "paper").rglob("*.md"))]
    return [p for p in docs if p.is_file()]


def test_make_figures_writes_every_table_and_figure(tmp_path):
    sections = make_figures.render_all(RESULTS)
    written = {p.name for p in make_figures.write(sections, tmp_path)}
    for name, sec in sections.items():
        assert f"{name}.md" in written
        assert sec.files, f"section {name}: no result file in benchmarks/results/"
        assert "Source: `" in (tmp_path / f"{name}.md").read_text()
        assert f"{name}.png" in sec.figures, f"section {name} drew no figure"
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    for name in ("batch_decode", "long_prompt", "rewrite"):  # measured on both machines
        text = sections[name].markdown
        assert "H200" in text and "CPU" in text and "not measured yet" not in text


def test_every_caption_names_its_file_and_command():
    for name, sec in make_figures.render_all(RESULTS).items():
        text = sec.markdown
        for f in sec.files:
            assert f"`{f.name}` from `{f.command()}`" in text, (name, f.name)
        for line in text.splitlines():
            if line.startswith(("*Figure:", "**Table:")):
                assert ".json" in line or line.startswith("**Table:"), line


def test_sections_without_results_say_not_measured(tmp_path):
    sections = make_figures.render_all(tmp_path)
    for name, sec in sections.items():
        assert not sec.files and not sec.figures
        assert "not measured yet" in sec.markdown, name
        assert not re.search(r"\d+\.\d+", sec.markdown), f"{name} shows numbers without a result file"


def test_paper_blocks_are_what_their_files_give():
    text = (REPO / "paper" / "paper.md").read_text()
    blocks = make_figures.blocks(text)
    assert sorted(name for name, _, _ in blocks) == sorted(make_figures.SECTIONS)
    for name, files, body in blocks:
        assert body.strip(), f"block {name} is empty: run paper/build.sh"
        rendered = make_figures.render_from(name, files).markdown
        assert body == rendered, f"block {name} differs from what {files} give: run paper/build.sh"


def test_splice_replaces_only_generated_blocks():
    sections = make_figures.render_all(RESULTS)
    text = "intro\n<!-- generated:rewrite files= -->\nold\n<!-- end generated:rewrite -->\noutro\n"
    out = make_figures.splice(text, sections)
    assert out.startswith("intro\n") and out.endswith("outro\n") and "old" not in out
    assert make_figures.blocks(out)[0][1] == [f.name for f in sections["rewrite"].files]


def test_every_result_file_mentioned_exists():
    missing = [(doc.relative_to(REPO).as_posix(), name) for doc in documents()
               for name in sorted(set(JSON_NAME.findall(doc.read_text())))
               if not (RESULTS / name).is_file() and not any(RESULTS.glob(f"*/{name}"))]  # superseded/: kept, not read
    assert not missing, f"named but not in benchmarks/results/: {missing}"


@functools.cache
def accepted_flags(script: str) -> frozenset[str]:
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"benchmarks/{script} --help failed: {out.stderr[-500:]}"
    return frozenset(re.findall(r"--[\w-]+", out.stdout))


def commands(text: str) -> list[list[str]]:
    """Token lists of the shell commands in fenced blocks and inline code spans."""
    snippets = []
    for block in FENCE.findall(text):
        snippets += block.replace("\\\n", " ").splitlines()
    snippets += SPAN.findall(text)
    out = []
    for snippet in snippets:
        try:
            out.append(shlex.split(snippet, comments=True))
        except ValueError:
            out.append(snippet.split())
    return out


def benchmark_flags(tokens: list[str]) -> list[tuple[str, str]]:
    """(script, flag) for each flag given to a benchmarks/*.py script in one command."""
    found, script = [], None
    for token in tokens:
        if token in SEPARATORS:
            script = None
        elif m := re.fullmatch(r"(?:\./)?benchmarks/(\w+\.py)", token):
            script = m[1]
        elif script and token.startswith("--"):
            found.append((script, token.split("=")[0]))
    return found


def test_every_benchmark_command_mentioned_exists_with_its_flags():
    bad = []
    for doc in documents():
        text, where = doc.read_text(), doc.relative_to(REPO).as_posix()
        bad += [(where, f"benchmarks/{s}") for s in set(SCRIPT.findall(text))
                if not (REPO / "benchmarks" / s).is_file()]
        for tokens in commands(text):
            for script, flag in benchmark_flags(tokens):
                if not (REPO / "benchmarks" / script).is_file():
                    continue  # reported above
                if flag not in accepted_flags(script):
                    bad.append((where, f"benchmarks/{script} {flag}"))
    assert not bad, f"commands that do not exist or flags the script refuses: {sorted(set(bad))}"


def test_command_parsing_finds_flags_across_continuations():
    text = "```\nLD_PRELOAD=x \\\n  python benchmarks/a.py --batches 1,2 --dense  # note --no\n```\n" \
           "and `python benchmarks/b.py --steps 24 | tee out` here"
    flags = [f for tokens in commands(text) for f in benchmark_flags(tokens)]
    assert flags == [("a.py", "--batches"), ("a.py", "--dense"), ("b.py", "--steps")]


def test_paper_prose_numbers_come_from_results():
    """Outside generated blocks, a measured value must appear in a generated table, in
    docs/benchmarks.md or in its log of runs, and its paragraph must name the result file it
    comes from."""
    text = (REPO / "paper" / "paper.md").read_text()
    generated = "".join(body for _, _, body in make_figures.blocks(text))
    quoted = generated + "".join((REPO / "docs" / name).read_text() for name in ("benchmarks.md", "benchmarks-log.md"))
    prose = make_figures.BLOCK.sub("", text)
    problems = []
    for para in re.split(r"\n\s*\n|\n(?=- )", prose):
        values = MEASURE.findall(para)
        if values and not JSON_NAME.search(para):
            problems.append(("names no result file", para[:80]))
        problems += [("not in any result table", v) for v in values
                     if not re.search(rf"(?<![\d.]){re.escape(v)}(?![\d])", quoted)]
    assert not problems, problems


def test_batch_table_leaves_out_runs_with_mlx_settings_changed():
    from paper.results import Result
    from paper.sections_engine import _mlx_settings, batch_decode

    rows = [{"batch": 8, "locals": {"decode_tps": {"median": m, "min": m, "max": m, "n": 1}}} for m in (100.0, 999.0)]
    plain = Result(Path("batch_decode-gpu-20260101-000000.json"),
                   {"model": "m", "tokens": 8, "prompt_len": 4, "mlx_env": {"MLX_PTX_CACHE_DIR": "x"}, "rows": [rows[0]]})
    tuned = Result(Path("batch_decode-gpu-20260102-000000.json"),
                   {"model": "m", "tokens": 8, "prompt_len": 4, "mlx_env": {"MLX_CUDA_GRAPH_CACHE_SIZE": "9"},
                    "rows": [rows[1]]})
    assert _mlx_settings(plain) == set() and _mlx_settings(tuned) == {"MLX_CUDA_GRAPH_CACHE_SIZE"}
    sec = batch_decode([plain, tuned])
    assert [f.name for f in sec.files] == [plain.name] and "100.0" in sec.markdown and "999.0" not in sec.markdown


def test_a_runs_command_names_the_mlx_settings_it_changed():
    from paper.results import Result

    argv = ["--prompt", "248", "--out", "results/"]
    changed = Result(Path("mixed_pass-gpu-20260101-000000.json"),
                     {"argv": argv, "mlx_env": {"MLX_USE_CUDA_GRAPHS": "0", "MLX_PTX_CACHE_DIR": "/k"}})
    plain = Result(Path("mixed_pass-gpu-20260102-000000.json"), {"argv": argv, "mlx_env": {"MLX_PTX_CACHE_DIR": "/k"}})
    assert changed.command() == "MLX_USE_CUDA_GRAPHS=0 python benchmarks/mixed_pass.py --prompt 248"
    assert plain.command() == "python benchmarks/mixed_pass.py --prompt 248"


def test_batch_table_fills_batch_sizes_only_from_runs_with_the_same_tuning_table():
    from paper.results import Result
    from paper.sections_engine import batch_files

    def run(day: int, batches: list[int], choices: dict | None) -> Result:
        rows = [{"batch": b, "locals": {"decode_tps": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1}}}
                for b in batches]
        return Result(Path(f"batch_decode-gpu-202601{day:02d}-000000.json"),
                      {"model": "m", "tokens": 8, "prompt_len": 4, "rows": rows, "tuning_choices": choices})

    table = {"q4-g64-bfloat16-64x32": {"8": "cuda-qmma-r16-t128"}}
    unrecorded, other, same, newest = run(1, [2], None), run(2, [16], {}), run(3, [32, 8], table), run(4, [8], table)
    assert [f.name for f in batch_files([unrecorded, other, same, newest])] == [newest.name, same.name]
    # No table (a CPU) and none recorded (older files) are the same setup.
    assert [f.name for f in batch_files([unrecorded, other])] == [other.name, unrecorded.name]


def test_a_gpu_result_is_labelled_with_the_gpu_it_records():
    from paper.results import Result

    def result(name: str, data: dict) -> Result:
        return Result(Path(name), data)

    assert result("mixed_pass-gpu-20260101-000000.json", {"device_name": "NVIDIA H100 80GB HBM3"}).label == "H100"
    served = {"machine": {"device_info": {"device_name": "NVIDIA H200"}}}
    assert result("serve_traffic-gpu-20260101-000000.json", served).label == "H200"
    assert result("step_profile-gpu-20260101-000000.json", {"machine": "x86_64"}).label == "H200"  # before names
    assert result("mixed_pass-cpu-20260101-000000.json", {}).label == "CPU (2 shared x86 cores)"


def test_the_served_figures_come_from_the_newest_report_of_warm_rounds():
    from paper.results import Result
    from paper.sections_served import newest_served

    def report(day: int, rounds: int) -> Result:
        wait = {"wait_s": {"median": 1.0, "min": 1.0, "max": 1.0, "n": rounds}}  # medians of `rounds` rounds
        return Result(Path(f"serve_traffic-gpu-202601{day:02d}-000000.json"),
                      {"model": "qwen3-4b", "rounds": rounds, "summary": {"locals": {"8": wait}, "mlx_lm.server": {"8": wait}}})

    warm, cold = report(1, 3), report(2, 1)
    assert newest_served([warm, cold], "gpu", "qwen3-4b") is warm  # a single cold round is no headline
    assert newest_served([cold], "gpu", "qwen3-4b") is cold  # unless it is all there is
    # locals against a variant of itself (--variant) is a diagnostic, however new and however many rounds
    ab = report(3, 3)
    ab.data["summary"] = {"locals": ab.data["summary"]["locals"], "locals graphs400": ab.data["summary"]["locals"]}
    assert newest_served([warm, ab], "gpu", "qwen3-4b") is warm


def test_each_agent_count_shows_its_newest_report():
    from paper.results import Result
    from paper.sections_served import newest_per_agent_count

    def report(day: int, agents: list[int]) -> Result:
        return Result(Path(f"serve_traffic-gpu-202601{day:02d}-000000.json"), {"model": "qwen3-4b", "agents": agents})

    old, eight, one_and_sixteen = report(1, [1, 8]), report(2, [8]), report(3, [1, 16])
    assert newest_per_agent_count([old, eight, one_and_sixteen]) == [one_and_sixteen, eight]
    both = report(4, [1, 8])
    assert newest_per_agent_count([old, eight, one_and_sixteen, both]) == [both, one_and_sixteen]
    assert newest_per_agent_count([]) == []


def test_a_run_on_one_gpu_does_not_hide_another_gpus_runs():
    from paper.results import Result
    from paper.sections_served import newest_per_machine

    def report(day: int, agents: list[int], gpu: str) -> Result:
        return Result(Path(f"serve_traffic-gpu-202601{day:02d}-000000.json"),
                      {"model": "qwen3-4b", "agents": agents, "device_name": f"NVIDIA {gpu}"})

    h200_eight, h200_sixteen, h100_eight = report(1, [8], "H200"), report(2, [1, 16], "H200"), report(3, [8], "H100")
    assert newest_per_machine([h200_eight, h200_sixteen, h100_eight]) == [h100_eight, h200_sixteen, h200_eight]
    assert newest_per_machine([]) == []


def test_a_report_whose_peer_died_mid_phase_is_no_headline():
    from paper.results import Result
    from paper.sections_served import newest_served

    def report(day: int, peer_answered: list[int]) -> Result:
        def runs(answered: list[int]) -> list[dict]:
            return [{"phases": {"16": {"figures": {"requests": 48, "failed": 48 - a}}}} for a in answered]

        wait = {"wait_s": {"median": 1.0, "min": 1.0, "max": 1.0, "n": 3}}
        return Result(Path(f"serve_traffic-gpu-202601{day:02d}-000000.json"),
                      {"model": "qwen3-4b", "rounds": 3, "agents": [16],
                       "summary": {"locals": {"16": wait}, "mlx_lm.server": {"16": wait}},
                       "runs": {"locals": runs([48, 48, 48]), "mlx_lm.server": runs(peer_answered)}})

    burst_failed, died = report(1, [32, 32, 32]), report(2, [26, 8, 8])
    assert newest_served([burst_failed, died], "gpu", "qwen3-4b") is burst_failed  # its burst ran out of memory
    assert newest_served([died], "gpu", "qwen3-4b") is died  # unless it is all there is


def test_a_cold_report_whose_peer_lost_a_round_is_no_headline():
    from paper.results import Result
    from paper.sections_served import newest_served

    def report(day: int, peer_rounds: int, kernels: dict) -> Result:
        def figures(n: int) -> dict:
            return {"8": {"wait_s": {"median": 1.0, "min": 1.0, "max": 1.0, "n": n}}}

        return Result(Path(f"serve_traffic-gpu-202601{day:02d}-000000.json"),
                      {"model": "qwen3-4b", "rounds": 3, "agents": [8], "kernel_folders": kernels,
                       "summary": {"locals": figures(3), "mlx_lm.server": figures(peer_rounds)}, "runs": {}})

    warm_cut = report(1, 2, {"locals": 50, "mlx_lm.server": 39})  # warm starts: its two rounds compare
    cold_whole = report(2, 3, {"locals": 0, "mlx_lm.server": 0})
    cold_cut = report(3, 2, {"locals": 0, "mlx_lm.server": 0})  # a median of its cold round and one warm
    assert newest_served([warm_cut, cold_whole, cold_cut], "gpu", "qwen3-4b") is cold_whole
    assert newest_served([warm_cut, cold_cut], "gpu", "qwen3-4b") is warm_cut
    assert newest_served([cold_cut], "gpu", "qwen3-4b") is cold_cut  # unless it is all there is


def test_a_peer_started_with_added_arguments_is_named_so_in_the_caption():
    from paper.results import Result
    from paper.sections_served import _peer_args

    def report(weights: dict) -> Result:
        return Result(Path("serve_traffic-gpu-20260101-000000.json"), {"weights": weights})

    assert _peer_args(report({"locals": "m", "mlx_lm.server": "m"})) == ""
    tuned = report({"locals": "m", "mlx_lm.server": "m; run with --prompt-concurrency 2",
                    "locals small": "m; LOCALS_KV_BUDGET_MB=512"})
    assert _peer_args(tuned) == " mlx_lm.server ran with `--prompt-concurrency 2`."


def test_commands_leave_out_the_mlx_settings_locals_sets_itself():
    from locals.engine.load.backend import CUDA_GRAPH_CACHE
    from paper.results import Result

    own = {"MLX_PTX_CACHE_DIR": "/k", "MLX_CUDA_GRAPH_CACHE_SIZE": str(CUDA_GRAPH_CACHE)}
    run = Result(Path("mixed_pass-cpu-20260101-000000.json"), {"argv": ["--batch", "8"], "mlx_env": own})
    assert run.mlx_settings() == {} and run.command() == "python benchmarks/mixed_pass.py --batch 8"
    chosen = Result(Path("mixed_pass-gpu-20260101-000000.json"),
                    {"argv": [], "mlx_env": {**own, "MLX_CUDA_GRAPH_CACHE_SIZE": "400"}})
    assert chosen.mlx_settings() == {"MLX_CUDA_GRAPH_CACHE_SIZE": "400"}
    assert chosen.command() == "MLX_CUDA_GRAPH_CACHE_SIZE=400 python benchmarks/mixed_pass.py"
