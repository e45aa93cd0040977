"""An OpenAI-style completions endpoint in front of a ``LiveServer`` (``shoal serve run --http``).

``POST /v1/completions`` with ``{"prompt": str | [token ids], "max_tokens": n, "stream": bool}``
answers ``{"id", "object": "text_completion", "model", "choices": [{"index": 0, "text",
"tokens", "finish_reason": "length"}], "usage"}``; with ``"stream": true`` the same as
server-sent events, one per generated token, then ``data: [DONE]``. ``GET /v1/models`` lists the
model. Text maps to tokens byte by byte (the model's weights are random: text out is for
plumbing, the token ids are what a test compares). Built on the standard library's threading
HTTP server: one thread per connection, every request handed to the coordinator's loop, which
runs in its own thread.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from shoal.serving.live import LiveServer, Rejected, Request


def encode(text: str, vocab: int) -> list[int]:
    return [b % vocab for b in text.encode("utf-8")]


def decode(tokens: list[int]) -> str:
    return bytes(t % 256 for t in tokens).decode("latin-1")


class Endpoint:
    """The HTTP server and the coordinator loop behind it; ``close()`` stops both."""

    def __init__(self, server: LiveServer, host: str = "127.0.0.1", port: int = 8000, *,
                 timeout_s: float = 120.0):
        self.server = server
        self.inbox: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.ids = itertools.count()
        self.timeout_s = timeout_s
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))  # may fail: nothing started
        self.httpd.daemon_threads = True
        self.loop = threading.Thread(target=server.run, daemon=True, kwargs={
            "inbox": self.inbox, "stop": self.stop, "timeout_s": timeout_s})
        self.loop.start()
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def submit(self, prompt: list[int], max_new: int) -> Request:
        r = Request(next(self.ids), prompt, max_new, sink=queue.Queue())
        self.inbox.put(r)
        return r

    def close(self) -> None:
        """Stop taking connections, then the coordinator loop (requests still open are answered
        with a rejection); the server's sockets are free once this returns."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.stop.set()
        self.loop.join()


def parse_request(body: object, vocab: int) -> tuple[list[int], int, bool]:
    """(prompt tokens, max_tokens, stream) of a completions request, or a ValueError saying
    what is wrong: the prompt is text or a non-empty list of token ids (integers in [0,
    vocab)), ``max_tokens`` a positive integer (16 by default), ``stream`` a boolean."""
    if not isinstance(body, dict) or "prompt" not in body:
        raise ValueError("expected a JSON object with 'prompt' (text or token ids), and "
                         "optionally 'max_tokens' and 'stream'")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        tokens = encode(prompt, vocab)
    elif isinstance(prompt, list) and all(type(t) is int for t in prompt):
        tokens = list(prompt)
    else:
        raise ValueError("'prompt' must be text or a list of integer token ids")
    if not tokens:
        raise ValueError("'prompt' is empty")
    if any(t < 0 or t >= vocab for t in tokens):
        raise ValueError(f"prompt token ids must be in [0, {vocab})")
    max_new = body.get("max_tokens", 16)
    if type(max_new) is not int or max_new < 1:
        raise ValueError(f"'max_tokens' must be a positive integer (got {max_new!r})")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ValueError(f"'stream' must be true or false (got {stream!r})")
    return tokens, max_new, stream


def _handler(ep: Endpoint):
    spec = ep.server.spec

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the CLI prints its own summary
            pass

        def _json(self, code: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, code: int, message: str) -> None:
            kind = ("not_found_error" if code == 404 else
                    "invalid_request_error" if 400 <= code < 500 else "server_error")
            self._json(code, {"error": {"message": message, "type": kind}})

        def _no_method(self) -> None:
            allowed = "POST" if self.path.rstrip("/") == "/v1/completions" else "GET"
            self._error(405, f"{self.command} {self.path}: allowed {allowed}")

        do_PUT = do_DELETE = do_PATCH = _no_method  # noqa: N815 (http.server's names)

        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": spec.name, "object": "model", "owned_by": "shoal"}]})
            elif self.path.rstrip("/") == "/v1/completions":
                self._no_method()
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self):  # noqa: N802
            if self.path.rstrip("/") != "/v1/completions":
                self._error(404, f"no route {self.path}")
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                tokens, max_new, stream = parse_request(body, spec.vocab_size)
            except ValueError as exc:
                self._error(400, str(exc))
                return
            if max_new < 1 or len(tokens) + max_new > spec.max_seq_len:
                self._error(400, f"prompt ({len(tokens)} tokens) + max_tokens ({max_new}) must "
                                 f"fit the model's context of {spec.max_seq_len}")
                return
            r = ep.submit(tokens, max_new)
            # a client that went away: its tokens have nowhere to go
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._answer(r, tokens, stream)

        def _answer(self, r: Request, tokens: list[int], stream: bool) -> None:
            rid = f"cmpl-{r.rid}"
            got: list[int] = []
            while True:
                try:
                    item = r.sink.get(timeout=ep.timeout_s + 5)
                except queue.Empty:
                    item = Rejected("no answer from the coordinator")
                if isinstance(item, Rejected) or item is None:
                    break
                if stream and not got:  # the first token: the stream starts (a request
                    # rejected before any token gets a 503, streamed or not)
                    self._start_stream()
                got.append(item)
                if stream:
                    self._chunk({"id": rid, "object": "text_completion", "model": spec.name,
                                 "created": int(time.time()), "choices": [
                                     {"index": 0, "text": decode([item]), "tokens": [item],
                                      "finish_reason": None}]})
            if isinstance(item, Rejected):
                if stream and got:  # rejected mid-stream: the status is sent already
                    self._chunk({"id": rid, "error": {"message": item.reason}})
                    self._end()
                else:
                    self._error(503, item.reason)
                return
            usage = {"prompt_tokens": len(tokens), "completion_tokens": len(got),
                     "total_tokens": len(tokens) + len(got)}
            if stream and not got:
                self._start_stream()
            if stream:
                self._chunk({"id": rid, "object": "text_completion", "model": spec.name,
                             "choices": [{"index": 0, "text": "", "tokens": [],
                                          "finish_reason": "length"}], "usage": usage})
                self._end()
                return
            self._json(200, {"id": rid, "object": "text_completion", "model": spec.name,
                             "created": int(time.time()), "choices": [
                                 {"index": 0, "text": decode(got), "tokens": got,
                                  "finish_reason": "length"}], "usage": usage})

        def _start_stream(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def _chunk(self, doc) -> None:
            data = f"data: {json.dumps(doc)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _end(self) -> None:
            data = b"data: [DONE]\n\n"
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n")
            self.wfile.flush()

    return Handler
