"""The HTTP side of the policy's OpenAI-compatible endpoint: a threaded server on localhost that
reads requests, hands each to the env's `answer(route, api_key, body)` and writes its status and
JSON body. One thread per connection: a request waits in its thread until the env's next vector
step generates its completion, while the other agents' requests come in.

Standard library only (`http.server`): an env rank starts one, with no web framework to install.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentenv_jax.envs.agent.openai_protocol import OpenAIError

# answer(route, api_key, body) -> (status, body); route: "models", "chat" or "completions".
Answer = Callable[[str, str | None, Any], tuple[int, dict[str, Any]]]
ROUTES = {
    ("GET", "/v1/models"): "models",
    ("POST", "/v1/chat/completions"): "chat",
    ("POST", "/v1/completions"): "completions",
}
MAX_BODY_BYTES = 64 << 20


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Every agent of an env rank may connect at once (socketserver's default backlog is 5:
    # the sixth connection of a burst was refused).
    request_queue_size = 1024
    answer: Answer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that closes a kept-alive connection (an agent run ending, the env closing)
        # is how connections end here, not an error to print.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the openai client reuses its connections

    def log_message(self, format: str, *args: Any) -> None:  # one line per call is noise
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        route = ROUTES.get((method, path))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if 0 < length <= MAX_BODY_BYTES else b""
        if route is None:
            error = OpenAIError(404, f"Unknown request URL: {method} {path}.", code="unknown_url")
            self._send(error.status, error.body())
            return
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body was not read
            error = OpenAIError(413, f"The request body is over {MAX_BODY_BYTES} bytes")
            self._send(error.status, error.body())
            return
        body: Any = None
        if method == "POST":
            try:
                body = json.loads(raw or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                error = OpenAIError(400, f"The request body is not valid JSON: {err}")
                self._send(error.status, error.body())
                return
        authorization = self.headers.get("Authorization") or ""
        api_key = authorization.removeprefix("Bearer ").strip() or None
        try:
            status, answer = self.server.answer(route, api_key, body)
        except OpenAIError as error:
            status, answer = error.status, error.body()
        except Exception as err:  # a bug here: the agent gets an answer, not a dropped line
            error = OpenAIError(500, f"{type(err).__name__}: {err}", type="server_error")
            status, answer = error.status, error.body()
        try:
            self._send(status, answer)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent gave up on the call (cancelled, timed out)

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")


class EndpointServer:
    """The server on `127.0.0.1` at a free port (`base_url` ends in `/v1`), answering in its
    own threads until `close()`."""

    def __init__(self, answer: Answer, host: str = "127.0.0.1", port: int = 0):
        self._server = _Server((host, port), _Handler)
        self._server.answer = answer
        self.port = int(self._server.server_address[1])
        self.base_url = f"http://{host}:{self.port}/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="agent-endpoint", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
