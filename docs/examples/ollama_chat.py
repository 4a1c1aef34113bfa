"""Chat with the `ollama` package, streamed (the Ollama API on locals' port)."""

import os

import ollama

client = ollama.Client(host=os.environ.get("LOCALS_URL", "http://127.0.0.1:8321"))

stream = client.chat(
    model="llama3.2",  # any name: locals answers with the model it runs
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    options={"temperature": 0, "num_predict": 40},
    stream=True,
)
for part in stream:
    print(part.message.content, end="", flush=True)
    if part.done:
        print(f"\n[{part.prompt_eval_count} prompt tokens, {part.eval_count} generated]")
