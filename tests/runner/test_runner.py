"""The team runner against a scripted OpenAI-compatible endpoint: patches, failures, cleanup."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agents.runner import RunOptions, run_team
from agents.tools import Toolbox
from locals.client import ChatClient

from tests.helpers.fake_openai import FakeOpenAI, call, calls, cut, text, turn
from tests.helpers.runner_project import (BAD_CODE, CHECK, GOOD_CODE, TASK, TESTS, agent_index, coder, git, make_project,
                                          one_part_plan, tool_results, worktrees)


def options(project, **overrides) -> RunOptions:
    base = dict(task=TASK, directory=project, check=CHECK, agents=3, max_steps=6, timeout_s=120)
    return RunOptions(**{**base, **overrides})


async def run(fake: FakeOpenAI, opts: RunOptions, events=None):
    async with fake as url, ChatClient(url) as client:
        return await run_team(opts, client, (events.append if events is not None else lambda e: None))


def assert_user_state_kept(project):
    assert (project / "notes.txt").read_text() == "first line\nuncommitted line\n"
    assert (project / "scratch.txt").read_text() == "untracked\n"
    assert len(worktrees(project)) == 1  # only the project itself
    assert "nothing added" not in git(project, "status")


@pytest.mark.needs_sandbox
async def test_readme_example_applies_the_passing_patch(tmp_path, locals_home):
    project = make_project(tmp_path)
    fake = FakeOpenAI(coder(good_agents={1}))
    events = []
    report = await run(fake, options(project), events)

    assert report.ok, report
    assert report.parts[0].status == "applied" and report.parts[0].winner == 1
    assert sorted(report.parts[0].files) == ["test_wordcount.py", "wordcount.py"]
    assert (project / "wordcount.py").read_text() == GOOD_CODE
    assert_user_state_kept(project)
    assert not list((locals_home / "state" / "runs").iterdir())
    # Every agent call offered the tool schemas and required a call; the planner asked for JSON.
    agent_calls = [b for b in fake.requests if "tools" in b]
    assert agent_calls and all(b["tool_choice"] == "required" for b in agent_calls)
    assert {t["function"]["name"] for t in agent_calls[0]["tools"]} == {
        "list_files", "read_file", "search", "write_file", "edit_file", "run", "finish"}
    assert fake.requests[0]["response_format"]["type"] == "json_schema"
    assert len({b["temperature"] for b in agent_calls}) == 3
    # Every reply tallied (10 tokens each, planner included) but a losing agent's call in flight when the
    # winner passed: it is cancelled with its agent, at most one per loser.
    lost = len(fake.requests) - report.completion_tokens // 10
    assert report.prompt_tokens > 0 and report.completion_tokens % 10 == 0 and 0 <= lost <= 2
    assert any(type(e).__name__ == "CheckDone" and e.passed for e in events)


@pytest.mark.needs_sandbox
async def test_no_agent_passes_leaves_the_project_untouched(tmp_path):
    project = make_project(tmp_path)
    before = git(project, "status", "--porcelain")
    report = await run(FakeOpenAI(coder(good_agents=set())), options(project, max_steps=5))

    assert not report.ok
    assert report.parts[0].status == "failed"
    assert "passed the check" in report.parts[0].detail
    assert not (project / "wordcount.py").exists()
    assert git(project, "status", "--porcelain") == before
    assert_user_state_kept(project)


@pytest.mark.needs_sandbox
async def test_failed_check_is_shown_to_the_agent_which_then_fixes_it(tmp_path):
    project = make_project(tmp_path)

    def script(body):
        if body.get("response_format"):
            return one_part_plan(body)
        steps = [
            calls(call("write_file", path="wordcount.py", content=BAD_CODE),
                  call("write_file", path="test_wordcount.py", content=TESTS)),
            calls(call("finish", summary="done")),
            calls(call("edit_file", path="wordcount.py", old_text="return 0", new_text="return len(text.split())")),
            calls(call("finish", summary="fixed")),
        ]
        return steps[min(turn(body), 3)]

    fake = FakeOpenAI(script)
    report = await run(fake, options(project, agents=1))
    assert report.ok
    assert (project / "wordcount.py").read_text() == GOOD_CODE
    assert any(r.startswith("The check failed") and "assert 0 == 3" in r for r in tool_results(fake))


@pytest.mark.needs_sandbox
async def test_uncommitted_edits_in_the_same_file_survive_and_agents_see_them(tmp_path):
    project = make_project(tmp_path)

    def script(body):
        if body.get("response_format"):
            return one_part_plan(body)
        steps = [
            calls(call("read_file", path="notes.txt")),
            calls(call("edit_file", path="notes.txt", old_text="uncommitted line\n",
                       new_text="uncommitted line\nagent line\n"),
                  call("write_file", path="test_notes.py",
                       content="def test_notes():\n    assert 'agent line' in open('notes.txt').read()\n")),
            calls(call("finish", summary="added a line")),
        ]
        return steps[min(turn(body), 2)]

    fake = FakeOpenAI(script)
    report = await run(fake, options(project, agents=1, task="add a line to notes.txt"))
    assert report.ok, report
    assert "uncommitted line" in tool_results(fake)[0]  # the worktree started from the user's state
    assert (project / "notes.txt").read_text() == "first line\nuncommitted line\nagent line\n"
    assert (project / "scratch.txt").read_text() == "untracked\n"


@pytest.mark.needs_sandbox
async def test_a_patch_that_no_longer_applies_is_kept_not_forced(tmp_path, locals_home):
    project = make_project(tmp_path)
    script = coder(good_agents={0})

    def racing_user(body):
        # The user creates wordcount.py while the agent works: the agent's patch must not clobber it.
        if turn(body) == 3:
            (project / "wordcount.py").write_text("# mine\n")
        return script(body)

    report = await run(FakeOpenAI(racing_user), options(project, agents=1))
    assert not report.ok
    part = report.parts[0]
    assert part.status == "conflict" and "kept at" in part.detail
    kept = next((locals_home / "state" / "patches").glob("*.patch"))
    assert "count_words" in kept.read_text()
    assert (project / "wordcount.py").read_text() == "# mine\n"
    assert_user_state_kept(project)


@pytest.mark.needs_sandbox
async def test_question_mode_prints_one_answer(tmp_path):
    project = make_project(tmp_path)

    def script(body):
        assert "response_format" not in body  # no planner in question mode
        names = {t["function"]["name"] for t in body["tools"]}
        assert "write_file" not in names and "run" not in names
        if turn(body) == 0:
            return calls(call("search", pattern="first"))
        return calls(call("finish", summary=f"notes.txt starts with 'first line' (agent {agent_index(body)})"))

    report = await run(FakeOpenAI(script), options(project, check=None, task="What does notes.txt start with?"))
    assert report.ok and report.mode == "question"
    assert report.answer.startswith("notes.txt starts with 'first line'")
    assert_user_state_kept(project)


async def test_a_call_cut_off_by_max_tokens_is_explained_to_the_agent(tmp_path):
    project = make_project(tmp_path)

    def script(body):
        if turn(body) == 0:
            return cut("read_file")
        told = body["messages"][-1]["content"]
        assert told.startswith("Your read_file call was cut off at the 1024-token reply limit and was not run")
        return calls(call("finish", summary="notes.txt starts with 'first line'"))

    report = await run(FakeOpenAI(script), options(project, check=None, agents=1, sandbox=False,
                                                   task="What does notes.txt start with?"))
    assert report.ok and report.answer.startswith("notes.txt starts with")


@pytest.mark.needs_sandbox
async def test_question_mode_asks_for_an_answer_when_steps_run_out(tmp_path):
    project = make_project(tmp_path)

    def script(body):
        if "tools" not in body:
            return text("It is a demo project.")
        return calls(call("list_files", path="."))

    report = await run(FakeOpenAI(script), options(project, check=None, agents=1, max_steps=2, task="What is this?"))
    assert report.ok and report.answer == "It is a demo project."


@pytest.mark.needs_sandbox
async def test_cancelling_a_run_removes_every_worktree(tmp_path, locals_home):
    """What Ctrl-C does: the main task is cancelled mid-request; nothing is left behind."""
    project = make_project(tmp_path)
    fake = FakeOpenAI(coder(good_agents={0}), delay_s=30)
    async with fake as url, ChatClient(url) as client:
        task = asyncio.create_task(run_team(options(project, parts=1), client))
        for _ in range(200):
            if len(fake.requests) >= 3:
                break
            await asyncio.sleep(0.05)
        assert len(worktrees(project)) == 4  # the project and three agents' worktrees
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)
        assert fake.cancelled == 3  # the server saw every agent hang up
    assert_user_state_kept(project)
    assert not list((locals_home / "state" / "runs").iterdir())


@pytest.mark.parametrize("parts", [pytest.param(1, id="agents", marks=pytest.mark.needs_sandbox),
                                   pytest.param(None, id="planner")])
async def test_timeout_stops_the_run_and_says_so(tmp_path, parts):
    project = make_project(tmp_path)
    report = await run(FakeOpenAI(coder(good_agents={0}), delay_s=30), options(project, parts=parts, timeout_s=1))
    assert not report.ok and report.parts[0].status == "timeout"
    assert report.message == "part 1 timeout: stopped after 1 s"
    assert_user_state_kept(project)


@pytest.mark.needs_sandbox
async def test_planned_parts_run_in_order_and_a_failed_part_skips_its_dependents(tmp_path):
    project = make_project(tmp_path)
    plan = {"parts": [{"goal": "write the code", "files": ["wordcount.py"], "depends_on": []},
                      {"goal": "write the tests", "files": ["test_wordcount.py"], "depends_on": [1]}]}

    def script(body):
        if body.get("response_format"):
            assert body["response_format"]["json_schema"]["schema"]["properties"]["parts"]["maxItems"] == 2
            return text(json.dumps(plan))
        return calls(call("finish", summary="nothing to do"))  # changes nothing: cannot pass

    report = await run(FakeOpenAI(script), options(project, agents=1, parts=2, max_steps=2))
    assert [p.status for p in report.parts] == ["failed", "skipped"]
    assert "needs part 1" in report.parts[1].detail
    assert_user_state_kept(project)


@pytest.mark.needs_sandbox
async def test_an_unusable_plan_falls_back_to_one_part(tmp_path):
    project = make_project(tmp_path)
    script = coder(good_agents={0})
    events = []

    def bad_planner(body):
        return text("sure! here is my plan") if body.get("response_format") else script(body)

    report = await run(FakeOpenAI(bad_planner), options(project, agents=1), events)
    assert report.ok
    assert "one part" in events[0].note and events[0].parts[0].goal == TASK


@pytest.mark.needs_sandbox
async def test_calls_after_a_failed_finish_are_skipped_and_one_call_per_turn_is_asked(tmp_path):
    project = make_project(tmp_path)
    tests = TESTS

    def script(body):
        steps = [
            calls(call("write_file", path="wordcount.py", content=GOOD_CODE), call("finish", summary="early"),
                  call("write_file", path="test_wordcount.py", content=tests)),
            calls(call("write_file", path="test_wordcount.py", content=tests)),
            calls(call("finish", summary="done")),
        ]
        return steps[min(turn(body), 2)]

    fake = FakeOpenAI(script)
    report = await run(fake, options(project, agents=1, parts=1))
    assert report.ok
    assert all(b["parallel_tool_calls"] is False for b in fake.requests)
    results = tool_results(fake)
    assert any("no tests ran" in r for r in results) and "skipped: calls after finish are not run" in results


@pytest.mark.needs_sandbox
async def test_a_defect_in_one_agents_step_ends_that_agent_not_the_run(tmp_path, monkeypatch):
    project = make_project(tmp_path)
    listing = Toolbox._list_files

    def broken(self, args):  # a bug the tools do not foresee, hit by agent 0 only
        if args.get("path") == "boom":
            raise RuntimeError("a defect")
        return listing(self, args)

    monkeypatch.setattr(Toolbox, "_list_files", broken)
    good = coder(good_agents={1})

    def script(body):
        if not body.get("response_format") and agent_index(body) == 0:
            return calls(call("list_files", path="boom"))
        return good(body)

    events = []
    report = await run(FakeOpenAI(script), options(project, agents=2, parts=1), events)
    assert report.ok and report.parts[0].winner == 1
    assert any(getattr(e, "agent", None) == 0 and e.status == "error" and "RuntimeError: a defect" in e.action
               for e in events if type(e).__name__ == "AgentStep")


@pytest.mark.needs_sandbox
async def test_a_passing_patch_to_a_file_that_is_not_utf8_is_applied_byte_for_byte(tmp_path):
    project = make_project(tmp_path)

    def script(body):
        steps = [calls(call("run", command="printf 'caf\\351 = 1\\n' > latin.txt")), calls(call("finish", summary="done"))]
        return steps[min(turn(body), 1)]

    report = await run(FakeOpenAI(script), options(project, agents=1, parts=1, check="true"))
    assert report.ok and report.parts[0].status == "applied", report
    assert (project / "latin.txt").read_bytes() == b"caf\xe9 = 1\n"


def test_plans_are_validated_and_dependencies_only_point_back():
    from agents.planner import parse_plan, plan_schema

    schema = plan_schema(None)
    one = parse_plan(json.dumps({"parts": [{"goal": "noise", "files": ["x"], "depends_on": []}]}), schema, TASK)
    assert [(p.goal, p.files) for p in one] == [(TASK, [])]
    raw = {"parts": [{"goal": "a", "files": [" a.py "], "depends_on": [2, 1]},
                     {"goal": " ", "files": [], "depends_on": [1, 2, 5]}]}
    two = parse_plan(json.dumps(raw), schema, TASK)
    assert [(p.goal, p.files, p.depends_on) for p in two] == [("a", ["a.py"], []), (TASK, [], [0])]
    with pytest.raises(Exception):
        parse_plan(json.dumps({"parts": []}), schema, TASK)


@pytest.mark.needs_sandbox
async def test_kept_runs_survive_later_runs_cleanup(tmp_path, locals_home):
    from agents.worktree import clean_stale_runs

    project = make_project(tmp_path)
    report = await run(FakeOpenAI(coder(good_agents=set())), options(project, max_steps=3, keep=True))
    kept = Path(report.kept_at)
    assert kept.is_dir() and list(kept.glob("*.transcript.json"))
    dead = locals_home / "state" / "runs" / "999999999-dead"  # a run whose process died
    dead.mkdir()
    (dead / "owner.json").write_text(json.dumps({"pid": 999999999, "project": str(project)}))
    assert clean_stale_runs() == 1
    assert kept.is_dir() and not dead.exists()


def test_the_users_global_excludes_stay_in_force_in_worktrees(tmp_path, monkeypatch):
    from agents.worktree import RunArea, open_project

    project = make_project(tmp_path)
    ignore = tmp_path / "xdg" / "git" / "ignore"
    ignore.parent.mkdir(parents=True)
    ignore.write_text("*.log\n.idea/\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    area = RunArea(open_project(project), root=tmp_path / "runs")
    (project / "build.log").write_text("x")
    (project / "__pycache__").mkdir()
    (project / "__pycache__" / "m.pyc").write_text("x")
    untracked = area.git(project).ls_files("--others", "--exclude-standard").split()
    assert untracked == ["scratch.txt"]  # the user's *.log and locals' own caches both ignored
    area.cleanup()


def test_a_subfolder_of_a_repository_is_refused_with_the_top_named(tmp_path):
    from agents.worktree import ProjectError, open_project

    project = make_project(tmp_path)
    (project / "sub").mkdir()
    with pytest.raises(ProjectError, match=f"pass --dir {project.resolve()}"):
        open_project(project / "sub")
    assert open_project(project).working_tree_dir == str(project)


def test_the_live_table_keeps_one_line_a_row_in_80_columns():
    import io

    from rich.console import Console

    from agents.display import LiveDisplay
    from agents.events import AgentStep, CheckDone

    display = LiveDisplay(Console(file=io.StringIO(), width=80), max_steps=12)
    display(AgentStep(0, 0, 3, "write_file wordcount.py (" + "a long description " * 5 + ")", 1234))
    display(CheckDone(0, 0, False, "no file has been changed yet: write the code, then call finish " * 2))
    out = Console(file=io.StringIO(), width=80, record=True)
    out.print(display.render())
    lines = [line for line in out.export_text().splitlines() if line.strip() and line != "planning…"]
    assert len(lines) == 2 and "last action" in lines[0] and "check" in lines[0] and "tokens" in lines[0]
    assert "write_file" in lines[1] and "fail" in lines[1] and "1,234" in lines[1]
    question = LiveDisplay(Console(file=io.StringIO(), width=80), max_steps=3, question=True)
    out = Console(file=io.StringIO(), width=80, record=True)
    out.print(question.render())
    assert out.export_text().splitlines()[0] == "starting…"  # a question has no planner
    question(AgentStep(0, 0, 1, "read_file calc.py", 99))
    out = Console(file=io.StringIO(), width=80, record=True)
    out.print(question.render())
    shown = out.export_text()
    assert "check" not in shown and "read_file calc.py" in shown  # nor a check


def test_a_printed_answer_keeps_its_long_lines_whole():
    import io

    from rich.console import Console

    from agents.display import print_summary
    from agents.runner import RunReport

    code = "    result = call_something(argument_one, argument_two, argument_three, argument_four)"
    answer = f"Use this:\n{code}\nthen run it."
    out, console = io.StringIO(), Console(file=io.StringIO(), width=80)
    print_summary(Console(file=out, width=40), console, RunReport(mode="question", ok=True, answer=answer))
    assert out.getvalue() == answer + "\n"
