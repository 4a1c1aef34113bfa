"""`/api/generate` with a JSON schema as `format`, through the `ollama` package: the
response is JSON that follows the schema."""

import json
import os

import ollama

client = ollama.Client(host=os.environ.get("LOCALS_URL", "http://127.0.0.1:8321"))

city = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
}
reply = client.generate(
    model="any",
    prompt="Which city is the capital of France? Answer as JSON with the city and its country.",
    format=city,  # "json" asks for any JSON object
    options={"temperature": 0, "num_predict": 60},
)
data = json.loads(reply.response)
print(json.dumps(data))
print(f"city={data['city']!r} country={data['country']!r}")
