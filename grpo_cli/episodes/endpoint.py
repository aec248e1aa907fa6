"""The run's OpenAI-compatible HTTP endpoint (docs/how-to/agents.md): what the user's agent code calls.

It listens on 127.0.0.1 only, at a free port, and answers only this run's random key. Each episode has its own
path, `/e/<episode>/v1`, so a request names the episode whose trajectory it extends; once the episode closes, its
path answers 410. The wire format is OpenAI's: `POST chat/completions` and `completions`, `GET models`; errors
are `{"error": {"message", "type", "code"}}` with a 4xx status. What a request asks is served by `answer`
(agent.AgentGenerator.answer): this module knows HTTP and the wire format, not the model.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import select
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

MAX_BODY = 8 * 2**20  # bytes a request's body may hold
ROUTES = ("chat/completions", "completions", "models")


class Refusal(Exception):
    """A request the endpoint answers with an error: its HTTP status, OpenAI's error type and code, a sentence."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.code = status, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "code": self.code, "param": None}}


class Endpoint:
    """The HTTP server of one run. `answer(episode, route, body) -> dict` serves a checked request (raising
    Refusal for what it refuses); `sent(episode, reached)` hears that a completion's answer was written, and
    whether it reached the agent (an answer whose connection closed first never did); `episodes` holds the ids
    whose paths are open."""

    def __init__(self, answer: Callable[[str, str, dict], dict], model: str, sent: Callable[[str, bool], None]):
        self.answer, self.sent, self.model, self.key = answer, sent, model, secrets.token_urlsafe(24)
        self.episodes: set[str] = set()
        self.lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.endpoint = self  # type: ignore[attr-defined]
        self.port = self.server.server_address[1]
        self.servers: list[socketserver.BaseServer] = [self.server]
        threading.Thread(target=self.server.serve_forever, name="grpo-endpoint", daemon=True).start()

    def serve_unix(self, path: str) -> None:
        """Serve on the Unix socket `path` too (for confined agent workers: episodes/agent_workers.py)."""
        server = _UnixServer(path, _UnixHandler)
        os.chmod(path, 0o666)  # a confined worker runs as a user id of its own
        server.endpoint = self  # type: ignore[attr-defined]
        self.servers.append(server)
        threading.Thread(target=server.serve_forever, name="grpo-endpoint-unix", daemon=True).start()

    def base_url(self, episode: str) -> str:
        return f"http://127.0.0.1:{self.port}/e/{episode}/v1"

    def open(self, episode: str) -> None:
        with self.lock:
            self.episodes.add(episode)

    def close_episode(self, episode: str) -> None:
        with self.lock:
            self.episodes.discard(episode)

    def is_open(self, episode: str) -> bool:
        with self.lock:
            return episode in self.episodes

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
            if isinstance(server, _UnixServer):
                os.unlink(str(server.server_address))

    def route(self, method: str, path: str, headers, body: bytes | None) -> tuple[str | None, Any]:
        """A request checked in order (key, path, episode, body, model), then answered: (the episode whose
        completion it is, or None; the JSON to send, or with stream=true its Events)."""
        given = headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.key}".encode()):
            raise Refusal(
                401, "Incorrect API key: use the key this run gave the agent (row['_endpoint']).", "invalid_api_key"
            )
        parts = path.split("?")[0].strip("/").split("/", 3)
        if len(parts) != 4 or parts[0] != "e" or parts[2] != "v1" or parts[3] not in ROUTES:
            raise Refusal(
                404, f"No route {path}; this endpoint serves {', '.join('/v1/' + r for r in ROUTES)}.", "not_found"
            )
        episode, route = parts[1], parts[3]
        if not self.is_open(episode):
            raise Refusal(
                410,
                "This episode has closed: its trajectory was scored; start from the row you were given.",
                "episode_closed",
            )
        if route == "models":
            if method != "GET":
                raise Refusal(405, "Use GET for /v1/models.", "method_not_allowed")
            return None, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "grpo-cli"}]}
        if method != "POST":
            raise Refusal(405, f"Use POST for /v1/{route}.", "method_not_allowed")
        try:
            request = json.loads(body or b"")
        except ValueError as e:
            raise Refusal(400, f"The body is not JSON ({e}).", "invalid_json") from None
        if not isinstance(request, dict):
            raise Refusal(400, "The body must be a JSON object.", "invalid_json")
        if request.get("model") != self.model:
            raise Refusal(
                404, f"The model {request.get('model')!r} does not exist here; use {self.model!r}.", "model_not_found"
            )
        stream = request.get("stream") or False
        if not isinstance(stream, bool):
            raise Refusal(400, "stream must be true or false.", "invalid_stream")
        out = self.answer(episode, route, request)
        if stream:
            usage = bool((request.get("stream_options") or {}).get("include_usage"))
            return episode, Events(out, usage)
        return episode, out


class _Quiet:
    def handle_error(self, request, client_address) -> None:
        """A client that went away (its agent's process ended) is no error of the run's; anything else is."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)  # type: ignore[misc]


class _Server(_Quiet, ThreadingHTTPServer):
    request_queue_size = 4096  # connections waiting to be accepted: every episode of a step may connect at once


class _UnixServer(_Quiet, socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 4096


class _Handler(BaseHTTPRequestHandler):
    server_version = "grpo-cli"
    protocol_version = "HTTP/1.1"  # connections kept between an episode's requests
    disable_nagle_algorithm = True  # headers and body go as they are written: no 40 ms wait on a delayed ACK

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        """Quiet: the run's console is the trainer's."""

    def _serve(self, method: str) -> None:
        endpoint: Endpoint = self.server.endpoint  # type: ignore[attr-defined]
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                if length <= 8 * MAX_BODY:  # read, so the client is not cut off mid-send and reads the answer
                    for start in range(0, length, 2**20):
                        self.rfile.read(min(2**20, length - start))
                raise Refusal(
                    413, f"The body holds {length:,} bytes, over the limit of {MAX_BODY:,}.", "body_too_large"
                )
            body = self.rfile.read(length) if length else None
            status, (episode, out) = 200, endpoint.route(method, self.path, self.headers, body)
        except Refusal as e:
            status, episode, out = e.status, None, e.body()
        streamed = isinstance(out, Events)
        data = out.data() if isinstance(out, Events) else json.dumps(out).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 413:
            self.send_header("Connection", "close")
            self.close_connection = True
        reached = False
        try:
            if episode is not None and self._peer_gone():
                raise BrokenPipeError
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            reached = True
        except (BrokenPipeError, ConnectionResetError):  # the agent stopped waiting: the answer never reached it
            self.close_connection = True
        finally:
            if episode is not None:
                endpoint.sent(episode, reached)

    def _peer_gone(self) -> bool:
        """The client closed its side while its request was served (it gave up waiting)."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")


class _UnixHandler(_Handler):
    disable_nagle_algorithm = False  # a Unix socket has no Nagle to disable

    def address_string(self) -> str:
        return "unix"


# ---- OpenAI's wire format -------------------------------------------------------------------------------
def request_options(body: dict, run_max: int) -> tuple[int, int, bool, int]:
    """(n, the reply's token cap, whether log-probs are asked, how many alternatives per token) from a request;
    the run's cap bounds the request's."""
    n = body.get("n") or 1
    asked = body.get("max_completion_tokens") or body.get("max_tokens") or run_max
    logprobs, top = body.get("logprobs"), body.get("top_logprobs") or 0
    if not isinstance(n, int) or not 1 <= n <= 16:
        raise Refusal(400, "n must be a whole number from 1 to 16.", "invalid_n")
    if not isinstance(asked, int) or asked < 1:
        raise Refusal(400, "max_tokens must be a positive whole number.", "invalid_max_tokens")
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
        raise Refusal(400, "top_logprobs must be a whole number from 0 to 20.", "invalid_top_logprobs")
    if isinstance(logprobs, int) and not isinstance(logprobs, bool):  # completions: logprobs=K asks K alternatives
        logprobs, top = logprobs > 0 or bool(top), max(top, min(logprobs, 5))
    if top and not logprobs:
        raise Refusal(400, "top_logprobs needs logprobs=true.", "invalid_top_logprobs")
    return n, min(asked, run_max), bool(logprobs), top


def normal(message) -> dict:
    """A message as compared across requests: role, text content ("" for none), tool calls (arguments parsed),
    tool_call_id and name where given; what else the client sends (refusal, annotations, ...) is not compared."""
    if not isinstance(message, dict) or "role" not in message:
        raise Refusal(400, f"A message must be an object with a role: {str(message)[:80]}.", "invalid_messages")
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": c["function"]["name"], "arguments": arguments(c["function"].get("arguments"))},
            }
            for c in calls
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def arguments(value) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except ValueError:
            return value
    return value if value is not None else {}


def same_reply(ours: dict, theirs: dict) -> bool:
    keys = ("role", "content", "tool_calls")
    return theirs.get("role") == "assistant" and all(ours.get(k) == theirs.get(k) for k in keys)


def wire_logprobs(pieces: list[str], logps, tops: list[list[tuple[str, float]]] | None = None) -> list[dict]:
    """The sampled tokens' log-probs as chat completions give them, each with its alternatives (top_logprobs)."""
    tops = tops or [[] for _ in pieces]
    return [
        {
            "token": p,
            "logprob": float(v),
            "bytes": list(p.encode()),
            "top_logprobs": [{"token": t, "logprob": float(w), "bytes": list(t.encode())} for t, w in top],
        }
        for p, v, top in zip(pieces, logps, tops)
    ]


def chat_choice(index: int, content: str, calls: list[dict], first_call: int, reason: str, lp) -> dict:
    """A chat completion's choice: the assistant message, its tool calls numbered from `first_call`."""
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call{first_call + i:05d}",
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
            }
            for i, c in enumerate(calls)
        ]
    return {
        "index": index,
        "message": message,
        "finish_reason": reason,
        "logprobs": {"content": lp} if lp is not None else None,
    }


def text_choice(index: int, text: str, reason: str, lp) -> dict:
    """A completion's choice, its log-probs in the legacy form."""
    legacy = None
    if lp:
        legacy = {
            "tokens": [x["token"] for x in lp],
            "token_logprobs": [x["logprob"] for x in lp],
            "top_logprobs": [{t["token"]: t["logprob"] for t in x["top_logprobs"]} for x in lp]
            if any(x["top_logprobs"] for x in lp)
            else None,
            "text_offset": [],
        }
    return {"index": index, "text": text, "finish_reason": reason, "logprobs": legacy}


class Events:
    """A whole answer as the server-sent events a streaming client reads (stream=true): per choice its text and
    tool calls in one delta each, then its finish; the usage when stream_options asks; then [DONE]. A batch samples
    the whole reply before any of it is sent, so it is sent at once."""

    def __init__(self, out: dict, usage: bool):
        self.out, self.usage = out, usage

    def data(self) -> bytes:
        out = self.out
        chat = out["object"] == "chat.completion"
        head = {"id": out["id"], "created": out["created"], "model": out["model"]}
        head["object"] = "chat.completion.chunk" if chat else "text_completion"
        events = []
        for c in out["choices"]:
            if not chat:
                events.append({**head, "choices": [c]})
                continue
            message, index = c["message"], c["index"]
            first = {"role": "assistant", "content": message.get("content")}
            opening = {"index": index, "delta": first, "logprobs": c["logprobs"], "finish_reason": None}
            events.append({**head, "choices": [opening]})
            if message.get("tool_calls"):
                calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                events.append(
                    {**head, "choices": [{"index": index, "delta": {"tool_calls": calls}, "finish_reason": None}]}
                )
            events.append({**head, "choices": [{"index": index, "delta": {}, "finish_reason": c["finish_reason"]}]})
        if self.usage:
            events.append({**head, "choices": [], "usage": out["usage"]})
        return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def response(kind: str, name: str, model: str, choices: list[dict], prompt_tokens: int, used: int) -> dict:
    return {
        "id": name,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": used, "total_tokens": prompt_tokens + used},
    }
