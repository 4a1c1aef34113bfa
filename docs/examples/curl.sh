#!/usr/bin/env bash
# Every API locals speaks, with curl: one request each, its JSON (or stream) printed
# under a "### name" line. The model name in a request is ignored.
set -euo pipefail
URL="${LOCALS_URL:-http://127.0.0.1:8321}"

post() {  # post PATH BODY: print the reply; an HTTP error prints its JSON body and stops the script
  curl -sS --fail-with-body "$URL$1" -H 'Content-Type: application/json' -d "$2"
  echo
}

echo "### openai chat, streamed"
curl -sSN --fail-with-body "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d '{
  "model": "any", "stream": true, "max_tokens": 30, "temperature": 0,
  "messages": [{"role": "user", "content": "What is the capital of France?"}]}'

echo "### openai json schema"
post /v1/chat/completions '{
  "model": "any", "max_tokens": 60, "temperature": 0,
  "messages": [{"role": "user", "content": "Name a city and its country as JSON."}],
  "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": {
    "type": "object", "required": ["city", "country"],
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}}}}}}'

echo "### openai tool call"
post /v1/chat/completions '{
  "model": "any", "max_tokens": 80, "temperature": 0, "tool_choice": "required",
  "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
  "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}'

echo "### openai responses"
post /v1/responses '{"model": "any", "max_output_tokens": 30, "temperature": 0,
  "input": "What is the capital of France?"}'

echo "### anthropic messages with a tool"
post /v1/messages '{
  "model": "any", "max_tokens": 80, "tool_choice": {"type": "any"},
  "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
  "tools": [{"name": "get_weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]}'

echo "### ollama chat"
post /api/chat '{"model": "any", "stream": false, "options": {"temperature": 0, "num_predict": 30},
  "messages": [{"role": "user", "content": "What is the capital of France?"}]}'

echo "### ollama generate with a format schema"
post /api/generate '{"model": "any", "stream": false, "options": {"temperature": 0, "num_predict": 60},
  "prompt": "Which city is the capital of France? Answer as JSON.",
  "format": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}'
