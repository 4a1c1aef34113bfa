"""The HTTP server: OpenAI, Anthropic and Ollama APIs, dashboard and metrics on aiohttp.

It reaches the engine only through `Backend` (submit/stream, cancel, stats); `app.create_app`
builds the application, `run.serve` runs it in the foreground with a loaded model.
"""
