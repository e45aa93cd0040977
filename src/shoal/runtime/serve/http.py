"""An OpenAI-style completions endpoint in front of a ``LiveServer`` (``shoal serve run --http``).

``POST /v1/completions`` with ``{"prompt": str | [token ids], "max_tokens": n, "stream": bool}``
answers ``{"id", "object": "text_completion", "model", "choices": [{"index": 0, "text",
"tokens", "finish_reason": "length"}], "usage"}``; with ``"stream": true`` the same as
server-sent events, one per generated token, then ``data: [DONE]``. ``GET /v1/models`` lists the
model and ``GET /health`` says which workers are live; both answer 503 when nothing can be
served. Text maps to tokens byte by byte (the model's weights are random: text out is for
plumbing, the token ids are what a test compares).

Built on the standard library's threading HTTP server, with the bounds a server facing any
client needs: a listen backlog for bursts of connections, a cap on open connections (past it a
503), a read timeout (a stalled client frees its thread), a cap on the body (413) and on how
deep its JSON nests (400), ``Content-Length`` or chunked bodies, and a JSON error for every
failure, a 405 with ``Allow`` for a method a path does not take. Each connection has a thread;
every request is handed to the coordinator's loop, which runs in its own thread: a request
whose loop has stopped is answered 503 at once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import queue
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from shoal.files import finite_float, json_depth
from shoal.runtime.serve.live import LiveServer
from shoal.runtime.serve.traffic import Rejected, Request

MAX_BODY_BYTES = 1 << 20  # or 16 bytes per token of the model's context, if more
MAX_JSON_DEPTH = 32  # a completions request nests two levels
READ_TIMEOUT_S = 15.0  # the most one read of a request may wait for the client
MAX_CONNECTIONS = 256  # open at once; each holds a thread
BACKLOG = 1024  # connections the kernel holds until accepted (the system's cap may be lower)
STALE_S = 30.0  # a coordinator loop that has not looked at its workers for this long is stuck
ROUTES = {"/v1/completions": "POST", "/v1/models": "GET", "/health": "GET"}


def encode(text: str, vocab: int) -> list[int]:
    return [b % vocab for b in text.encode("utf-8")]


def decode(tokens: list[int]) -> str:
    return bytes(t % 256 for t in tokens).decode("latin-1")


class HttpError(Exception):
    """A request answered with ``status`` and a JSON error saying ``message``."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class _Server(ThreadingHTTPServer):
    """The threading server with a backlog for bursts and a cap on open connections: past it a
    connection gets a 503 at once rather than a thread."""

    request_queue_size = BACKLOG
    daemon_threads = True

    def __init__(self, address, endpoint: Endpoint, max_connections: int):
        super().__init__(address, _Handler)
        self.endpoint = endpoint  # what the handler answers with
        self.max_connections = max_connections
        self.open = 0
        self.lock = threading.Lock()
        self.errors: dict[str, int] = {}  # exception type -> requests it ended (health)

    def handle_error(self, request, client_address):
        """A connection that failed (the client went away or reset it, or a handler's bug):
        counted, not printed (the socketserver default prints a traceback per connection)."""
        name = type(sys.exc_info()[1]).__name__
        with self.lock:
            self.errors[name] = self.errors.get(name, 0) + 1

    def process_request(self, request, client_address):
        with self.lock:
            full = self.open >= self.max_connections
            if not full:
                self.open += 1
        if full:
            body = json.dumps({"error": {"message": "too many open connections",
                                         "type": "server_error"}}).encode()
            with contextlib.suppress(OSError):  # a fresh socket's buffer takes it at once
                request.setblocking(False)
                request.send(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                             b"application/json\r\nConnection: close\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.open -= 1


class Endpoint:
    """The HTTP server and the coordinator loop behind it; ``close()`` stops both."""

    def __init__(self, server: LiveServer, host: str = "127.0.0.1", port: int = 8000, *,
                 timeout_s: float = 120.0, read_timeout_s: float = READ_TIMEOUT_S,
                 max_body_bytes: int | None = None, max_connections: int = MAX_CONNECTIONS):
        self.server = server
        self.inbox: queue.Queue = queue.Queue()
        self.stop = threading.Event()
        self.ids = itertools.count()
        self.timeout_s = timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_body_bytes = max_body_bytes or max(MAX_BODY_BYTES,
                                                    16 * server.spec.max_seq_len)
        self.failure: str | None = None  # why the coordinator loop stopped, if it did
        self.httpd = _Server((host, port), self, max_connections)  # may fail: nothing started
        self.loop = threading.Thread(target=self._loop, daemon=True)
        self.loop.start()
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        """The coordinator's loop; should it ever stop with an error, the error is kept (and
        every request then answered 503 with it) and the requests waiting are rejected."""
        try:
            self.server.run(inbox=self.inbox, stop=self.stop, timeout_s=self.timeout_s)
        except BaseException as exc:  # kept for /health and every answer, not printed
            self.failure = f"the coordinator loop stopped: {type(exc).__name__}: {exc}"[:500]
        finally:
            while True:
                try:
                    r = self.inbox.get_nowait()
                except queue.Empty:
                    break
                r.sink.put(Rejected(self.failure or "the server stopped"))

    def loop_down(self) -> str | None:
        """Why the coordinator loop takes no requests (it stopped, or is stuck), or None."""
        if self.failure is not None or not self.loop.is_alive():
            return self.failure or "the coordinator loop stopped"
        h = self.server.health
        if h and time.perf_counter() - h["at"] > STALE_S:
            return f"the coordinator loop has not run for {time.perf_counter() - h['at']:.0f} s"
        return None

    def unavailable(self) -> str | None:
        """Why no request can be served now, or None: the coordinator loop is down, or no
        chain of live workers holds the model."""
        why = self.loop_down()
        if why is not None:
            return why
        h = self.server.health
        if h and not h["can_serve"]:
            starting = [n for n, w in h["workers"].items() if w["state"] == "starting"]
            return "no chain of live workers holds the model" + (
                f" (starting again: {', '.join(starting)})" if starting else "")
        return None

    def health(self) -> tuple[int, dict]:
        """(status, document) of ``GET /health``: 200 when requests can be served, else 503
        with the reason; the workers' states, restarts and dropped messages either way."""
        h = self.server.health
        why = self.unavailable()
        doc = {"status": "ok" if why is None else "unavailable", "model": self.server.spec.name}
        if why is not None:
            doc["reason"] = why
        if h:
            doc |= {"live_workers": [n for n, w in h["workers"].items() if w["state"] == "live"],
                    "workers": h["workers"], "requests": h["requests"],
                    "dropped_messages": h["dropped_messages"], "dropped_why": h["dropped_why"]}
        with self.httpd.lock:
            doc["http"] = {"open_connections": self.httpd.open,
                           "failed_connections": dict(self.httpd.errors)}
        return (200 if why is None else 503), doc

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
        raise ValueError(f"'max_tokens' must be a positive integer (got {max_new!r:.50})")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ValueError(f"'stream' must be true or false (got {stream!r:.50})")
    return tokens, max_new, stream


def parse_body(data: bytes) -> object:
    """A request body's JSON, or a ValueError: nested past ``MAX_JSON_DEPTH`` (checked before
    the parser, which recurses once per level), not UTF-8 JSON, or a number past a float's
    range or a NaN or infinity (JSON has none)."""
    if json_depth(data, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise ValueError(f"the JSON nests more than {MAX_JSON_DEPTH} levels")

    def constant(name):
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(data, parse_float=finite_float, parse_constant=constant)
    except RecursionError:  # past the check only if Python's own limit is lower
        raise ValueError("the JSON nests too deeply") from None
    except ValueError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests, answered by the endpoint its server holds."""

    protocol_version = "HTTP/1.1"

    @property
    def timeout(self) -> float:
        """Of every read and write of the socket: a stalled client raises TimeoutError and its
        connection is closed."""
        return self.ep.read_timeout_s

    @property
    def ep(self) -> Endpoint:
        return self.server.endpoint

    @property
    def spec(self):
        return self.ep.server.spec

    def log_message(self, *args):  # quiet: the CLI prints its own summary
        pass

    def handle_one_request(self):
        """One request; a handler's own failure is a 500 (when no answer has started)
        rather than a connection closed with no answer, and is counted by the server."""
        self.replied = False
        try:
            super().handle_one_request()
        except OSError:
            raise
        except Exception as exc:
            self.close_connection = True
            if not self.replied:
                with contextlib.suppress(OSError):
                    self._error(500, f"internal error ({type(exc).__name__})")
            raise

    def send_response(self, code, message=None):
        self.replied = True
        super().send_response(code, message)

    def _route(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def _json(self, code: int, doc: dict, headers: dict | None = None) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, code: int, message: str, headers: dict | None = None) -> None:
        kind = ("not_found_error" if code == 404 else
                "invalid_request_error" if 400 <= code < 500 else "server_error")
        self._json(code, {"error": {"message": message, "type": kind}}, headers)

    def send_error(self, code, message=None, explain=None):
        """The server's own errors (a malformed request line, headers too long, a method
        it has no handler for) as JSON errors too, an unknown method as a 405."""
        self.close_connection = True
        if code == 501:  # no do_<METHOD>: a method no path here takes
            self._no_method()
            return
        with contextlib.suppress(OSError):
            self._error(code, message or self.responses.get(code, ("error",))[0])

    def _no_method(self) -> None:
        route = self._route()
        if route not in ROUTES:
            self._error(404, f"no route {self.path}")
            return
        self._error(405, f"{self.command} {route}: allowed {ROUTES[route]}",
                    {"Allow": ROUTES[route]})

    do_HEAD = do_OPTIONS = do_PUT = do_DELETE = do_PATCH = _no_method  # noqa: N815

    def handle_expect_100(self):
        """``Expect: 100-continue``: a body that will be refused is not asked for."""
        try:
            self._length()
        except HttpError as exc:
            self.close_connection = True
            self._error(exc.status, str(exc))
            return False
        return super().handle_expect_100()

    def do_GET(self):  # noqa: N802 (http.server's name)
        route = self._route()
        if route == "/health":
            status, doc = self.ep.health()
            self._json(status, doc)
        elif route == "/v1/models":
            why = self.ep.unavailable()
            if why is not None:
                self._error(503, why)
                return
            self._json(200, {"object": "list", "data": [
                {"id": self.spec.name, "object": "model", "owned_by": "shoal"}]})
        else:
            self._no_method()

    def do_POST(self):  # noqa: N802
        if self._route() != "/v1/completions":
            self._no_method()
            return
        read = False
        try:
            data = self._body()
            read = True
            try:
                tokens, max_new, stream = parse_request(parse_body(data), self.spec.vocab_size)
            except ValueError as exc:
                raise HttpError(400, str(exc)) from None
            if len(tokens) + max_new > self.spec.max_seq_len:
                raise HttpError(400, f"prompt ({len(tokens)} tokens) + max_tokens "
                                     f"({max_new}) must fit the model's context of "
                                     f"{self.spec.max_seq_len}")
            down = self.ep.loop_down()
            if down is not None:
                raise HttpError(503, down)
        except HttpError as exc:
            if not read:  # where the body ends is unknown: the connection carries no more
                self.close_connection = True
            self._error(exc.status, str(exc))
            if not read:
                self._discard()
            return
        r = self.ep.submit(tokens, max_new)
        try:
            self._answer(r, tokens, stream)
        except OSError:  # the client went away, or stopped reading: the answer is cut
            self.close_connection = True

    def _length(self) -> int | None:
        """The body's announced length (None: chunked), or an HttpError: both or neither
        of Content-Length and chunked Transfer-Encoding, a length that is not a
        non-negative integer, or one past the cap."""
        te = self.headers.get_all("Transfer-Encoding") or []
        cl = self.headers.get_all("Content-Length") or []
        if te:
            if [t.strip().lower() for t in te] != ["chunked"]:
                raise HttpError(501, f"Transfer-Encoding {', '.join(te)[:50]!r}: only "
                                     "chunked is taken")
            if cl:  # which one frames the body is ambiguous: refused (RFC 9112 §6.3)
                raise HttpError(400, "both Content-Length and Transfer-Encoding")
            return None
        if not cl:
            raise HttpError(411, "a body needs Content-Length or Transfer-Encoding: "
                                 "chunked")
        if len(set(cl)) > 1 or not (cl[0].strip().isdigit() and len(cl[0].strip()) <= 18):
            raise HttpError(400, f"Content-Length {', '.join(cl)[:50]!r} is not one "
                                 "non-negative integer")
        n = int(cl[0])
        if n > self.ep.max_body_bytes:
            raise HttpError(413, f"a body of {n:,} bytes; at most {self.ep.max_body_bytes:,}")
        return n

    def _body(self) -> bytes:
        n = self._length()
        if n is not None:
            data = self.rfile.read(n)
            if len(data) != n:
                raise HttpError(400, f"the body ended after {len(data)} of {n} bytes")
            return data
        parts, total = [], 0
        while True:  # chunks: a hex size line, the bytes, CRLF; size 0 ends (RFC 9112 §7.1)
            line = self.rfile.readline(1024)
            size = line.split(b";")[0].strip()
            if not line.endswith(b"\n") or not size or len(size) > 16 or any(
                    c not in b"0123456789abcdefABCDEF" for c in size):
                raise HttpError(400, "a malformed chunk size line")
            n = int(size, 16)
            if n == 0:
                break
            total += n
            if total > self.ep.max_body_bytes:
                raise HttpError(413, f"a chunked body past {self.ep.max_body_bytes:,} bytes")
            parts.append(self.rfile.read(n))
            if len(parts[-1]) != n or self.rfile.read(2) != b"\r\n":
                raise HttpError(400, "a chunk shorter than its size")
        for _ in range(64):  # trailer fields, up to the empty line: read and ignored
            line = self.rfile.readline(8192)
            if line in (b"\r\n", b"\n", b""):
                return b"".join(parts)
        raise HttpError(400, "too many trailer lines")

    def _discard(self) -> None:
        """Close after an answer to a request whose body was not read: stop sending, read
        what the client still sends for a moment (a close with unread bytes resets the
        connection, and the client could lose the answer), then close."""
        with contextlib.suppress(OSError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(1.0)
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and self.connection.recv(65536):
                pass

    def _next(self, r: Request):
        """The request's next token, None when done, or a Rejected: waits for the
        coordinator, looking every second whether its loop still runs."""
        deadline = time.monotonic() + self.ep.timeout_s + 5
        while True:
            try:
                return r.sink.get(timeout=1.0)
            except queue.Empty:
                pass
            down = self.ep.loop_down()
            if down is not None:
                return Rejected(down)
            if time.monotonic() > deadline:
                return Rejected("no answer from the coordinator")

    def _answer(self, r: Request, tokens: list[int], stream: bool) -> None:
        rid = f"cmpl-{r.rid}"
        got: list[int] = []
        while True:
            item = self._next(r)
            if isinstance(item, Rejected) or item is None:
                break
            if stream and not got:  # the first token: the stream starts (a request
                # rejected before any token gets a 503, streamed or not)
                self._start_stream()
            got.append(item)
            if stream:
                self._chunk({"id": rid, "object": "text_completion", "model": self.spec.name,
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
            self._chunk({"id": rid, "object": "text_completion", "model": self.spec.name,
                         "choices": [{"index": 0, "text": "", "tokens": [],
                                      "finish_reason": "length"}], "usage": usage})
            self._end()
            return
        self._json(200, {"id": rid, "object": "text_completion", "model": self.spec.name,
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
