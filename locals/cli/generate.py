"""`locals generate`, `locals chat` and `locals models`: the model without the daemon."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from locals.cli.common import console, console_err, load_with_spinner, prepare_model_process
from locals.errors import LocalsError, RequestError
from locals.protocol import FinishEvent, GenerationRequest, SamplingParams, TokenEvent


def _read_schema(path: Path) -> dict:
    """The schema file's object ({} allows any JSON value); anything else says how to fix it."""
    try:
        schema = json.loads(path.read_text())
    except OSError as exc:
        raise LocalsError(f"{path}: cannot read the schema ({exc.strerror})") from None
    except ValueError as exc:
        raise LocalsError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise LocalsError(f"{path}: a JSON schema is an object, not {json.dumps(schema)[:40]}; "
                          'write {} to allow any JSON value, or e.g. {"type": "object"}')
    return schema


def _stream(engine, request: GenerationRequest, out=sys.stdout) -> tuple[FinishEvent, float]:
    """Print a request's text as it arrives; returns the finish event and time to first token."""
    start, ttft = time.perf_counter(), None
    finish = None
    with contextlib.closing(engine.generate(request)) as events:  # Ctrl-C: closing cancels the request
        for event in events:
            if isinstance(event, TokenEvent):
                ttft = ttft if ttft is not None else time.perf_counter() - start
                out.write(event.text)
                out.flush()
            elif isinstance(event, FinishEvent):
                finish = event
    if finish.reason == "error":
        raise LocalsError(f"generation failed: {finish.error}")
    if finish.reason == "memory":
        raise LocalsError(_cli_names(finish.error or "this request can never fit in memory; lower max_tokens"))
    return finish, ttft or 0.0


def _cli_names(message: str) -> str:
    """An engine or API message with `max_tokens` spelled as this command's option."""
    return re.sub(r"`?\bmax_tokens\b`?", "--max-tokens", message)


def _sampling(**values) -> SamplingParams:
    """SamplingParams from the command's options; LocalsError naming the option out of range."""
    sampling = SamplingParams(**values)
    problem = sampling.problem()
    if problem:
        raise LocalsError(re.sub(r"`(\w+)`", lambda m: "--" + m.group(1).replace("_", "-"), problem))
    return sampling


# A rate over less time than this says nothing: a schema's fixed text arrives with the first
# token, and 10 tokens in 3 ms read as 3,000 tok/s.
RATE_MIN_S = 0.1


def _report(finish: FinishEvent, ttft: float, elapsed: float) -> None:
    decode = elapsed - ttft
    tokens = finish.usage.completion_tokens
    rate = f", {(tokens - 1) / decode:.1f} tok/s" if tokens > 1 and decode >= RATE_MIN_S else ""
    console_err.print(
        f"[dim]{finish.usage.prompt_tokens} prompt tokens, {tokens} generated "
        f"({finish.reason}); first token {ttft:.2f} s{rate}[/dim]"
    )


def generate(
    prompt: str = typer.Option(..., "--prompt", "-p", help="The user message to answer (- reads it from stdin)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Alias, HF repo, folder or GGUF file."),
    max_tokens: int = typer.Option(256, "--max-tokens", help="Most tokens to generate."),
    temperature: float = typer.Option(0.7, "--temperature", "-t", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling mass."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Makes sampling reproducible."),
    schema: Optional[Path] = typer.Option(None, "--schema", help="JSON schema file the answer must follow."),
    system: Optional[str] = typer.Option(None, "--system", help="A system message."),
) -> None:
    """Answer one prompt, streaming to stdout; speed and token counts go to stderr."""
    sampling = _sampling(temperature=temperature, top_p=top_p, seed=seed, max_tokens=max_tokens)
    prepare_model_process()  # may re-exec this process: stdin is read after it
    if prompt == "-":  # `git diff | locals generate -p -`
        prompt = sys.stdin.read().strip()
    if not prompt.strip():  # an empty diff piped in: no made-up answer to nothing
        raise LocalsError("the prompt is empty: give the text to answer with -p (or pipe it in with -p -)")
    json_schema = _read_schema(schema) if schema else None
    loaded = load_with_spinner(model)
    from locals.engine import build_constraint, create_engine, encode_prompt, render_prompt

    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}]
    tokens = encode_prompt(loaded, render_prompt(loaded, messages))
    try:
        constraint = (build_constraint(loaded, json_schema=json_schema, max_tokens=max_tokens, strict_schema=True)
                      if json_schema is not None else None)
    except RequestError as exc:  # the API's field names, as this command spells them
        raise LocalsError(_cli_names(str(exc))) from None
    request = GenerationRequest(
        prompt_tokens=tokens,
        sampling=sampling,
        constraint=constraint,
    )
    engine = create_engine(loaded)
    engine.start()
    try:
        start = time.perf_counter()
        finish, ttft = _stream(engine, request)
        sys.stdout.write("\n")
        sys.stdout.flush()  # before the figures on stderr, where both go to one log
        _report(finish, ttft, time.perf_counter() - start)
    finally:
        engine.stop()


def chat(
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Alias, HF repo, folder or GGUF file."),
    max_tokens: int = typer.Option(1024, "--max-tokens", help="Most tokens per reply."),
    temperature: float = typer.Option(0.7, "--temperature", "-t", help="0 = greedy."),
    system: Optional[str] = typer.Option(None, "--system", help="A system message."),
) -> None:
    """Chat in the terminal; the conversation is kept. /exit (or Ctrl-D) leaves, Ctrl-C stops a reply."""
    _sampling(temperature=temperature, max_tokens=max_tokens)
    prepare_model_process()
    loaded = load_with_spinner(model)
    from locals.engine import create_engine, encode_prompt, render_prompt

    history = [{"role": "system", "content": system}] if system else []
    engine = create_engine(loaded)
    engine.start()
    console_err.print(f"[dim]{CHAT_COMMANDS}; Ctrl-C stops a reply[/dim]")
    try:
        while True:
            try:
                line = console.input("[bold green]> [/bold green]")
            except (EOFError, KeyboardInterrupt):
                console.print()  # the shell's prompt on a line of its own
                break
            command = line.strip()
            if command.lower() in ("/exit", "/quit"):
                break
            if command.lower() == "/reset":
                history = history[:1] if system else []
            elif re.fullmatch(r"/[a-zA-Z]+", command):  # a mistyped command is not a message to the model
                console_err.print(f"[yellow]unknown command {command}[/yellow]: {CHAT_COMMANDS}")
            elif command:
                history.append({"role": "user", "content": line})
                request = GenerationRequest(encode_prompt(loaded, render_prompt(loaded, history)),
                                            _sampling(temperature=temperature, max_tokens=max_tokens))
                _chat_turn(engine, request, history)
    finally:
        engine.stop()


def _chat_turn(engine, request: GenerationRequest, history: list[dict]) -> None:
    """Stream one reply into `history`; Ctrl-C or a failed turn ends the reply, not the chat."""
    reply = _CollectingWriter()
    try:
        finish, _ = _stream(engine, request, out=reply)
        note = {"length": "cut at --max-tokens", "loop": "stopped: it was repeating itself"}.get(finish.reason)
    except KeyboardInterrupt:
        note = "stopped"
    except LocalsError as exc:
        sys.stdout.write("\n")
        console_err.print(f"[red]error:[/red] {exc}")
        history.pop()  # the question goes too: ask again, differently
        return
    sys.stdout.write("\n")
    if note:
        console_err.print(f"[dim]({note})[/dim]")
    history.append({"role": "assistant", "content": reply.text})


CHAT_COMMANDS = "/exit or /quit (or Ctrl-D) to leave, /reset to forget the conversation"


class _CollectingWriter:
    """Writes to stdout and keeps the text (the reply goes into the chat history)."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s
        sys.stdout.write(s)

    def flush(self) -> None:
        sys.stdout.flush()


def models() -> None:
    """List model aliases, what is downloaded in the Hugging Face cache, and what fits here."""
    from locals.engine.load.backend import detect
    from locals.engine.load.models_list import downloaded_models, fits, loaded_bytes

    dense = detect().dense_weights
    table = Table(title="Aliases" + (" (this CPU runs weights as float32: what fits counts that)" if dense else ""))
    for col in ("alias", "weights", "editor name", "size", "fits here", "note"):
        table.add_column(col, overflow="fold")
    for alias in _aliases():
        need = loaded_bytes(alias.size_gb * 1e9, alias.repo, dense)
        table.add_row(alias.name, alias.repo, alias.editor_name, f"{alias.size_gb:.1f} GB",
                      "yes" if fits(need) else "no", alias.note)
    # Piped, the table is not cut to 80 columns: repo ids stay whole, to copy.
    out = console if console.is_terminal else Console(width=max(console.width, 150))
    out.print(table)
    cached = downloaded_models()
    if cached:
        table = Table(title="Downloaded (Hugging Face cache)")
        for col in ("repo", "size", "fits here"):
            table.add_column(col, overflow="fold")
        for repo, size in cached:
            table.add_row(repo, f"{size / 1e9:.2f} GB", "yes" if fits(loaded_bytes(size, repo, dense)) else "no")
        out.print(table)
    else:
        console.print("[dim]No MLX models in the Hugging Face cache yet.[/dim]")


def _aliases():
    from locals.engine.load.catalog import ALIASES

    return ALIASES.values()


def register(app: typer.Typer) -> None:
    app.command()(generate)
    app.command()(chat)
    app.command()(models)
