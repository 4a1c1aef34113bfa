"""Streamed chat with the official `openai` package: text prints as it is written."""

import os

from openai import OpenAI

BASE_URL = os.environ.get("LOCALS_URL", "http://127.0.0.1:8321")
client = OpenAI(base_url=f"{BASE_URL}/v1", api_key="local")  # any key works unless the server sets --api-key

stream = client.chat.completions.create(
    model="locals",  # the name is ignored: the server answers with the model it runs
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=40,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},  # one last chunk with the token counts
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        print(f"\n[{chunk.usage.prompt_tokens} prompt tokens, {chunk.usage.completion_tokens} generated]")
