"""Security and robustness against the real daemon: foreign Host/Origin refused, bad JSON,
wrong types and huge bodies answered with 4xx JSON, and the server still serves after."""

from __future__ import annotations

import http.client
import json

import pytest

pytestmark = pytest.mark.slow


def post(server, path, body: bytes, headers=None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}).encode()


def test_foreign_host_and_origin_are_refused(locals_server):
    status, body = post(locals_server, "/v1/chat/completions", CHAT, {"Host": "attacker.example"})
    assert status == 403 and "Host" in body["error"]["message"]
    status, body = post(locals_server, "/v1/chat/completions", CHAT, {"Origin": "https://attacker.example"})
    assert status == 403
    local = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": False,
                        "options": {"num_predict": 3}}).encode()
    status, body = post(locals_server, "/api/chat", local, {"Origin": "http://localhost:3000"})
    assert status == 200


def test_bad_input_gets_4xx_json_and_the_server_lives(locals_server):
    assert post(locals_server, "/v1/chat/completions", b"{oops")[0] == 400
    status, body = post(locals_server, "/v1/messages", json.dumps({"messages": 3}).encode())
    assert status == 400 and body["type"] == "error"
    status, body = post(locals_server, "/api/chat", json.dumps({"messages": [], "options": []}).encode())
    assert status == 400 and isinstance(body["error"], str)
    huge = b'{"messages": [{"role": "user", "content": "' + b"x" * (33 << 20) + b'"}]}'
    try:
        status, body = post(locals_server, "/v1/chat/completions", huge)
        assert status == 413 and "--max-body-mb" in body["error"]["message"]
    except (ConnectionResetError, BrokenPipeError):
        pass  # the server may close the socket before the whole body is sent: also a refusal
    status, body = post(locals_server, "/v1/chat/completions", CHAT)
    assert status == 200 and body["choices"][0]["message"]["content"] is not None
    assert locals_server.get_json("/health")["status"] == "ok"


def test_non_loopback_bind_needs_the_flag(locals_server):
    done = locals_server.cli("serve", "--host", "0.0.0.0", "--port", "1", timeout=60)
    assert done.returncode == 1 and "--allow-remote" in done.stderr
