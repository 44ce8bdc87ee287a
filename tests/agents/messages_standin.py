"""A local stand-in for the Messages API at the network boundary: a real HTTP server on 127.0.0.1 that
answers ``POST /v1/messages`` from a script of recorded-style responses and records every request.

A script step is a response body (``message(...)``, sent with status 200), a ``Reply`` (status, body,
headers, a delay before answering), or a callable that gets the request body and returns one of those.
Instead of a script, a ``responder`` callable answers every request (for concurrent sessions). The
response shapes are the Messages API's: ``{"id": "msg_...", "type": "message", "role": "assistant",
"model", "content": [text / tool_use blocks], "stop_reason", "stop_sequence", "usage"}`` and, for
errors, ``{"type": "error", "error": {"type", "message"}, "request_id"}``.
"""
from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

MODEL_ID = "claude-sonnet-4-5-20250929"
_ids = itertools.count(1)


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool_use(name: str, input: Any, id: str | None = None) -> dict[str, Any]:  # noqa: A002 -- the API's field name
    return {"type": "tool_use", "id": id or f"toolu_01StandIn{next(_ids):06d}", "name": name, "input": input}


def message(*blocks: dict[str, Any], stop_reason: str | None = None, model: str = MODEL_ID,
            input_tokens: int = 1200, output_tokens: int = 180) -> dict[str, Any]:
    """One Messages API response; ``stop_reason`` is tool_use when a block calls a tool, end_turn otherwise."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    return {"id": f"msg_01StandIn{next(_ids):08d}", "type": "message", "role": "assistant", "model": model,
            "content": list(blocks), "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "service_tier": "standard"}}


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


def error(status: int, kind: str, msg: str, headers: dict[str, str] | None = None, delay_s: float = 0.0) -> Reply:
    return Reply(status, {"type": "error", "error": {"type": kind, "message": msg},
                          "request_id": f"req_01StandIn{next(_ids):06d}"}, headers or {}, delay_s)


def sent_key(headers: dict[str, str]) -> str | None:
    """The credential a request carried: ``x-api-key``, or the bearer token (anthropic 2.x sends the key
    as ``Authorization: Bearer``)."""
    auth = headers.get("authorization") or ""
    return headers.get("x-api-key") or (auth[len("Bearer "):] if auth.startswith("Bearer ") else None)


Step = dict[str, Any] | Reply | Callable[[dict[str, Any]], Any]


class MessagesStandIn:
    """``with MessagesStandIn(script) as api: ... api.url ... api.requests``."""

    def __init__(self, script: list[Step] | None = None, *,
                 responder: Callable[[dict[str, Any]], dict[str, Any] | Reply] | None = None):
        self.script = list(script or [])
        self.responder = responder
        self.requests: list[dict[str, Any]] = []  # {"path", "headers", "body"} in arrival order
        self._lock = threading.Lock()
        self._stop = threading.Event()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            wbufsize = 1 << 16  # headers and body leave in one write (flushed after each request)

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 -- http.server's naming
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = None
                reply = standin._answer(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                if reply.delay_s:
                    standin._stop.wait(reply.delay_s)
                payload = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.send_header("request-id", f"req_01StandIn{next(_ids):06d}")
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def _answer(self, path: str, headers: dict[str, str], body: Any) -> Reply:
        with self._lock:
            self.requests.append({"path": path, "headers": headers, "body": body})
            if path.split("?")[0] != "/v1/messages":
                return error(404, "not_found_error", f"no route {path}")
            if not sent_key(headers):
                return error(401, "authentication_error", "an x-api-key or Authorization: Bearer header is required")
            if self.responder is not None:
                step: Any = self.responder
            elif self.script:
                step = self.script.pop(0)
            else:
                return error(400, "invalid_request_error", "stand-in script exhausted")
        if callable(step):
            step = step(body)
        return step if isinstance(step, Reply) else Reply(200, step)

    @property
    def message_requests(self) -> list[dict[str, Any]]:
        """Bodies of the requests sent to /v1/messages."""
        return [r["body"] for r in self.requests if r["path"].startswith("/v1/messages")]

    def tool_results(self, request_index: int = -1) -> list[dict[str, Any]]:
        """The tool_result blocks of the last user message of one recorded request."""
        last = self.message_requests[request_index]["messages"][-1]
        content = last["content"] if isinstance(last["content"], list) else []
        return [b for b in content if b.get("type") == "tool_result"]

    def start(self) -> "MessagesStandIn":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "MessagesStandIn":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
