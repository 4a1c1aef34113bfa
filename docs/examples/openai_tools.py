"""Function calling with the `openai` package: the model calls a tool, we run it and send
the result back, and the model answers in text."""

import json
import os

from openai import OpenAI

BASE_URL = os.environ.get("LOCALS_URL", "http://127.0.0.1:8321")
client = OpenAI(base_url=f"{BASE_URL}/v1", api_key="local")

tools = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]


def get_weather(city: str) -> str:
    return f"Sunny, 24 C in {city}"


messages = [{"role": "user", "content": "What is the weather in Paris?"}]
first = client.chat.completions.create(
    model="locals", messages=messages, tools=tools, max_tokens=80, temperature=0,
    tool_choice="required",  # "auto" lets the model choose between text and a call
    parallel_tool_calls=False,  # at most one call per reply
)
message = first.choices[0].message
messages.append(message.model_dump(exclude_none=True))
for call in message.tool_calls:
    args = json.loads(call.function.arguments)  # offered tools are constrained: this always parses
    print(f"tool call: {call.function.name}({json.dumps(args)})")
    messages.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(**args)})

final = client.chat.completions.create(
    model="locals", messages=messages, tools=tools, max_tokens=60, temperature=0,
    tool_choice="none",  # answer in text now
)
print(f"answer: {final.choices[0].message.content}")
