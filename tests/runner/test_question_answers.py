"""What question mode gives a model besides tools: the files a question names in the first
prompt, and, once the steps are spent, the answer asked for over what the tool calls found."""

from __future__ import annotations

from agents.agent import without_repeats
from agents.prompts import FINDINGS_CHARS, final_answer_messages
from agents.runner import RunOptions, run_team
from agents.sandbox import Sandbox
from agents.tools import READ_TOOLS, Toolbox
from locals.client import ChatClient

from tests.helpers.fake_openai import FakeOpenAI, call, calls, text
from tests.helpers.runner_project import make_project


def _toolbox(root):
    return Toolbox(root, Sandbox([root], kind="none", tmp_dir=root), READ_TOOLS)


def test_the_files_a_question_names_come_with_it_small_text_and_inside_only(tmp_path):
    root, outside = tmp_path / "p", tmp_path / "secret.txt"
    (root / "src").mkdir(parents=True)
    outside.write_text("token=abc\n")
    (root / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "big.py").write_text("x = 1\n" * 1000)
    (root / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    (root / "link.txt").symlink_to(outside)
    (root / "mycalc.py").write_text("pass\n")
    names = ["src/calc.py", "big.py", "blob.bin", "link.txt", "mycalc.py"]
    question = "Which function in calc.py adds? See big.py, blob.bin and link.txt too."
    assert _toolbox(root).named_files(question, names) == [("src/calc.py", "def add(a, b):\n    return a + b\n")]
    assert _toolbox(root).named_files("What is in src/calc.py.", names)[0][0] == "src/calc.py"
    assert _toolbox(root).named_files("What does calc do?", names) == []


async def test_list_files_on_a_file_says_to_read_it(tmp_path):
    (tmp_path / "calc.py").write_text("pass\n")
    outcome = await _toolbox(tmp_path).execute("list_files", {"path": "calc.py"})
    assert not outcome.ok and outcome.text == "error: calc.py is a file, not a folder: read it with read_file"


def test_the_final_answer_is_asked_over_the_findings_as_plain_text():
    transcript = [{"role": "system", "content": "..."}, {"role": "user", "content": "Question: what adds?"}]
    for i in range(3):  # the same call three times, then a big read
        transcript += [{"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "a.py"}'}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "name": "list_files", "content": "error: a.py is a file"}]
    transcript += [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "r", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "b.py"}'}}]},
        {"role": "tool", "tool_call_id": "r", "name": "read_file", "content": "y" * (FINDINGS_CHARS // 2)}]
    messages = final_answer_messages(transcript)
    assert [m["role"] for m in messages] == ["system", "user"]
    asked = messages[1]["content"]
    assert asked.startswith("Question: what adds?") and "<tool_response>" not in asked
    assert asked.count('list_files {"path": "a.py"}:\nerror: a.py is a file') == 1  # said once, not three times
    assert asked.index("list_files") < asked.index('read_file {"path": "b.py"}:\n')  # in the order they ran
    transcript[-1]["content"] = "y" * FINDINGS_CHARS  # the newest finding takes the room: older ones go
    cut = final_answer_messages(transcript)[1]["content"]
    assert "list_files" not in cut and "... (cut)" in cut


def test_an_answer_that_loops_says_each_paragraph_once():
    looped = 'It is "add".\n\nIt is "add".\n\nIt is "add".\n\nIt is'
    assert without_repeats(looped) == 'It is "add".'
    assert without_repeats("First.\n\nSecond.\n\n\nThird.") == "First.\n\nSecond.\n\nThird."


async def test_question_mode_out_of_steps_shows_the_named_file_and_the_findings(tmp_path):
    project = make_project(tmp_path)
    seen = []

    def script(body):
        seen.append(body)
        if "tools" not in body:
            return text("It starts with 'first line'.\n\nIt starts with 'first line'.\n\nIt st")
        return calls(call("list_files", path="notes.txt"))

    opts = RunOptions(task="What does notes.txt start with?", directory=project, check=None, agents=1,
                      max_steps=2, timeout_s=120, sandbox=False)
    async with FakeOpenAI(script) as url, ChatClient(url) as client:
        report = await run_team(opts, client, lambda event: None)
    assert report.ok and report.answer == "It starts with 'first line'."
    first = seen[0]["messages"][1]["content"]
    assert "notes.txt:\n```\nfirst line\nuncommitted line\n```" in first  # what the worktree holds
    final = seen[-1]["messages"]
    assert all(m["role"] in ("system", "user") for m in final)
    assert final[-1]["content"].count("is a file, not a folder: read it with read_file") == 1
