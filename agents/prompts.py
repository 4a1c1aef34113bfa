"""The words the agents and the planner are given: short, concrete, one job each."""

from __future__ import annotations

from agents.events import Part

CODER_SYSTEM = (
    "You are a coding agent working in a copy of a software project. Use the tools to read and "
    "change its files; paths are relative to the project root. Work in small steps: look at the "
    "files that matter, write or edit the code, run the tests with `run`, and when the work is "
    "done call finish with a one-line summary. Your work is accepted only when this check passes: "
    "`{check}`."
)

ASKER_SYSTEM = (
    "You answer a question about a software project. Use the tools to find and read the files "
    "that matter (paths are relative to the project root), then call finish with the answer: "
    "short, concrete, naming files and functions."
)

PLANNER_SYSTEM = (
    "You split a programming task into parts for a team. Most tasks are one part; split only "
    "when the task has clearly separate pieces. Each part is accepted only when the project's whole "
    "check passes with it and the parts before it, so never split code from its tests, and never "
    "split fixes that one test run needs together. Each part has a goal (one sentence), the files "
    "it concerns, and depends_on: the numbers (1-based) of earlier parts it needs. Answer in JSON."
)


def _named(files: list[tuple[str, str]]) -> list[str]:
    """The files the task names, as the first prompt shows them (Toolbox.named_files)."""
    lines = []
    for name, content in files:
        lines += ["", f"{name}:", "```", content.rstrip("\n"), "```"]
    return lines


def coder_messages(task: str, part: Part, n_parts: int, check: str, listing: str,
                   named: list[tuple[str, str]] = ()) -> list[dict[str, str]]:
    lines = [f"Task: {task}"]
    if n_parts > 1:
        lines.append(f"Your part ({part.index + 1} of {n_parts}): {part.goal}")
    if part.files:
        lines.append("Files: " + ", ".join(part.files))
    lines += ["", "Project files:", listing, *_named(named), "",
              "Read what you need, then write the code with write_file or edit_file."]
    return [
        {"role": "system", "content": CODER_SYSTEM.format(check=check)},
        {"role": "user", "content": "\n".join(lines)},
    ]


def asker_messages(question: str, listing: str, named: list[tuple[str, str]] = ()) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": ASKER_SYSTEM},
        {"role": "user", "content": "\n".join([f"Question: {question}", "", "Project files:", listing,
                                               *_named(named)])},
    ]


# What the final answer is shown of the tool calls, newest first (a small model's window is 8k).
FINDINGS_CHARS = 8_000


def final_answer_messages(messages: list[dict]) -> list[dict[str, str]]:
    """Question mode with the steps spent: the question and what the tool calls found, as plain
    text and without tools. Asked over the whole transcript instead, a small model echoes the
    last tool result in the template's markup rather than answer."""
    calls = {c["id"]: c["function"] for m in messages if m.get("role") == "assistant"
             for c in m.get("tool_calls") or []}
    findings, seen, size = [], set(), 0
    for message in reversed([m for m in messages if m.get("role") == "tool"]):
        call = calls.get(message.get("tool_call_id"), {})
        note = f"{call.get('name', message.get('name', 'tool'))} {call.get('arguments', '')}".strip()
        note = f"{note}:\n{message.get('content', '')}"
        room = FINDINGS_CHARS - size
        if room < 200:
            break
        if note in seen:
            continue
        seen.add(note)
        findings.insert(0, note if len(note) <= room else note[:room] + "\n... (cut)")
        size += min(len(note), room)
    question = next(m["content"] for m in messages if m.get("role") == "user")
    found = "\n\n".join(findings) or "(nothing)"
    return [
        {"role": "system", "content": ASKER_SYSTEM.split(". ", 1)[0] + "."},
        {"role": "user", "content": f"{question}\n\nWhat your tool calls found:\n{found}\n\n"
                                    "Answer the question now, briefly: name the files and functions."},
    ]


def planner_messages(task: str, listing: str, parts: int | None) -> list[dict[str, str]]:
    count = "as many parts as it needs (1 to 4)" if parts is None else f"exactly {parts} parts"
    return [
        {"role": "system", "content": PLANNER_SYSTEM},
        {"role": "user", "content": f"Task: {task}\n\nProject files:\n{listing}\n\nSplit it into {count}."},
    ]
