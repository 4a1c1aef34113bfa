"""`locals run` on the README's example task, served by locals and by mlx_lm.server (same
weights), with 1, 4, ... agents: wall time, tokens, and whether a patch passed the check.

    python benchmarks/team_run.py --agents 1,4                 # CPU, embedded model
    python benchmarks/team_run.py --agents 1,4,8 --rounds 2

Each run gets a fresh git project; the servers start once each and serve every run, and
runs alternate between them. The runner's own client drives both (it constrains nothing;
the locals server constrains tool calls, mlx_lm.server does not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from agent_turns import Server, prepare_models  # noqa: E402
from common import summary, write_results  # noqa: E402

TASK = ("write wordcount.py with a function count_words(text) that returns the number of words, "
        "and tests in test_wordcount.py")
CHECK = "python3 -m pytest -q"


def new_project() -> Path:
    """An empty git project with one commit (what `locals run` needs)."""
    path = Path(tempfile.mkdtemp(prefix="team-run-"))
    (path / "README.md").write_text("# wordcount\n")
    env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost",
               GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@localhost")
    for cmd in (["git", "init", "-q"], ["git", "add", "."], ["git", "commit", "-qm", "start"]):
        subprocess.run(cmd, cwd=path, env=env, check=True)
    return path


def run_team(server: Server, agents: int, args) -> dict:
    """One `locals run --json` against `server`; its report plus the wall time."""
    project = new_project()
    cmd = [sys.executable, "-m", "locals", "run", TASK, "--dir", str(project), "--check", CHECK,
           "--server", f"http://127.0.0.1:{server.port}/v1", "--model", server.model_name,
           "--agents", str(agents), "--max-steps", str(args.max_steps), "--max-tokens", str(args.max_tokens),
           "--timeout", str(args.timeout), "--json"]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 120,
                          env=dict(os.environ, LOCALS_HOME=str(server.home)))
    wall = time.perf_counter() - started
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        report = {"ok": False, "message": (done.stderr or done.stdout)[-500:]}
    return {"agents": agents, "wall_s": wall, "ok": bool(report.get("ok")), "message": report.get("message", ""),
            "completion_tokens": report.get("completion_tokens", 0), "prompt_tokens": report.get("prompt_tokens", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", default="1,4", help="agent counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--peers", default="locals,mlx_lm")
    args = ap.parse_args()

    _tokenizer, models = prepare_models(None)
    home = Path(tempfile.mkdtemp(prefix="team-run-home-"))
    servers = {}
    try:
        for kind in args.peers.split(","):
            servers[kind] = Server(kind, models[kind], home / kind)
            servers[kind].home.mkdir(parents=True)
            servers[kind].start()
        runs = {kind: [] for kind in servers}
        for r in range(args.rounds):
            for agents in (int(a) for a in args.agents.split(",")):
                order = list(servers) if r % 2 == 0 else list(reversed(servers))
                for kind in order:
                    res = run_team(servers[kind], agents, args)
                    runs[kind].append(res)
                    print(f"{kind:7s} agents={agents}  {res['wall_s']:.0f} s  {res['completion_tokens']} tokens  "
                          f"passed: {res['ok']}", flush=True)
    finally:
        for s in servers.values():
            s.stop()
    table = {kind: {str(a): {"wall_s": summary([x["wall_s"] for x in rs if x["agents"] == a]),
                             "completion_tokens": summary([x["completion_tokens"] for x in rs if x["agents"] == a]),
                             "passed": sum(x["ok"] for x in rs if x["agents"] == a)}
                    for a in sorted({x["agents"] for x in rs})}
             for kind, rs in runs.items()}
    path = write_results("team_run", {"task": TASK, "check": CHECK, "args": vars(args), "runs": runs,
                                      "table": table})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
