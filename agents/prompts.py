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


def coder_messages(task: str, part: Part, n_parts: int, check: str, listing: str) -> list[dict[str, str]]:
    lines = [f"Task: {task}"]
    if n_parts > 1:
        lines.append(f"Your part ({part.index + 1} of {n_parts}): {part.goal}")
    if part.files:
        lines.append("Files: " + ", ".join(part.files))
    lines += ["", "Project files:", listing, "", "Read what you need, then write the code with write_file or edit_file."]
    return [
        {"role": "system", "content": CODER_SYSTEM.format(check=check)},
        {"role": "user", "content": "\n".join(lines)},
    ]


def asker_messages(question: str, listing: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": ASKER_SYSTEM},
        {"role": "user", "content": f"Question: {question}\n\nProject files:\n{listing}"},
    ]


def planner_messages(task: str, listing: str, parts: int | None) -> list[dict[str, str]]:
    count = "as many parts as it needs (1 to 4)" if parts is None else f"exactly {parts} parts"
    return [
        {"role": "system", "content": PLANNER_SYSTEM},
        {"role": "user", "content": f"Task: {task}\n\nProject files:\n{listing}\n\nSplit it into {count}."},
    ]
