"""The Anthropic Messages API with the `anthropic` package: a `tool_use` block comes back,
we send a `tool_result`, and the model answers in text."""

import os

import anthropic

BASE_URL = os.environ.get("LOCALS_URL", "http://127.0.0.1:8321")
client = anthropic.Anthropic(base_url=BASE_URL, api_key="local")  # no /v1: the package adds it

tools = [{
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}]


def get_weather(city: str) -> str:
    return f"Sunny, 24 C in {city}"


messages = [{"role": "user", "content": "What is the weather in Paris?"}]
first = client.messages.create(
    model="locals", max_tokens=80, messages=messages, tools=tools,
    # "any": a tool call is required; {"type": "auto"} lets the model choose
    tool_choice={"type": "any", "disable_parallel_tool_use": True},
)
results = []
for block in first.content:
    if block.type == "tool_use":
        print(f"tool_use: {block.name}({block.input})")  # input arrives as a dict that fits the schema
        results.append({"type": "tool_result", "tool_use_id": block.id, "content": get_weather(**block.input)})
messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": results}]

final = client.messages.create(model="locals", max_tokens=60, messages=messages, tools=tools,
                               tool_choice={"type": "none"})  # answer in text now
print("answer: " + "".join(block.text for block in final.content if block.type == "text"))
print(f"[stop_reason {final.stop_reason}; {final.usage.input_tokens} input tokens, "
      f"{final.usage.cache_read_input_tokens or 0} read from the prompt cache]")
