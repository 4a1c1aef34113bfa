"""JSON that follows a schema, with `response_format`: the reply always parses."""

import json
import os

from openai import OpenAI

BASE_URL = os.environ.get("LOCALS_URL", "http://127.0.0.1:8321")
client = OpenAI(base_url=f"{BASE_URL}/v1", api_key="local")

person = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
    },
    "required": ["name", "age", "email"],
}
reply = client.chat.completions.create(
    model="locals",
    messages=[{"role": "user", "content": "Ana Silva is 29; write to ana@example.com. Give her details as JSON."}],
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": person}},
    max_tokens=80,
    temperature=0,
)
data = json.loads(reply.choices[0].message.content)  # constrained decoding: this never fails
print(json.dumps(data))
print(f"name={data['name']!r} age={data['age']} email={data['email']!r}")
