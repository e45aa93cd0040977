"""The HTTP endpoint of `shoal serve run --http` against hostile or unusual clients: methods
it does not take, bodies too large, too deep or chunked, stalled connections, bursts of
connections, and a coordinator loop that stopped. A stand-in for the live server answers each
request at once, so that these tests need no worker processes."""

from __future__ import annotations

import http.client
import json
import queue
import socket
import time

import pytest
from tests._clock import patience

from shoal.catalog import TINY
from shoal.runtime.serve.http import Endpoint

# deadlines for what the server must do within its own short timeouts; generous, so that a
# loaded machine does not fail them, and short beside a server that would never do it
PATIENCE_S = 60.0


class StandIn:
    """A LiveServer's face to the endpoint (``spec``, ``run``, ``health``): every request gets
    tokens 0, 1, 2, ... at once. ``fail_after`` requests, its loop raises (a bug)."""

    def __init__(self, fail_after: int | None = None):
        self.spec = TINY
        self.fail_after = fail_after
        self.health = {}

    def run(self, *, inbox, stop, timeout_s):
        served = 0
        while not stop.is_set():
            self.health = {"at": time.perf_counter(), "can_serve": True, "workers": {},
                           "requests": {"waiting": 0, "running": 0}, "dropped_messages": 0,
                           "dropped_why": {}}
            try:
                r = inbox.get(timeout=0.05)
            except queue.Empty:
                continue
            if self.fail_after is not None and served >= self.fail_after:
                raise RuntimeError("a bug in the loop")
            for t in range(r.max_new):
                r.sink.put(t)
            r.sink.put(None)
            served += 1


@pytest.fixture()
def endpoint():
    ep = Endpoint(StandIn(), port=0)
    yield ep
    ep.close()


def _ask(ep, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=PATIENCE_S)
    try:
        conn.request(method, path, body, headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _raw(ep, data: bytes, *, wait_close: bool = False) -> bytes:
    """Send ``data`` on a new connection; what the server answers (until it closes, with
    ``wait_close``; else the first reply)."""
    with socket.create_connection(("127.0.0.1", ep.port), timeout=PATIENCE_S) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk
            if not wait_close and b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                n = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                          if ln.lower().startswith(b"content-length:")), 0)
                if len(rest) >= n:
                    return out


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def _error(reply: bytes) -> str:
    return json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["message"]


def test_head_options_and_unknown_methods_are_405_with_allow_as_json(endpoint):
    """The docs promise a 405 for other methods: HEAD and OPTIONS used to get the standard
    library's HTML 501. Every method a path does not take is a 405 with Allow and a JSON
    error (HEAD: no body); an unknown path stays a 404."""
    for method, path, allow in (("HEAD", "/v1/completions", "POST"),
                                ("OPTIONS", "/v1/completions", "POST"),
                                ("OPTIONS", "/v1/models", "GET"), ("PUT", "/health", "GET"),
                                ("FROB", "/v1/completions", "POST"),
                                ("GET", "/v1/completions", "POST")):
        status, headers, body = _ask(endpoint, method, path)
        assert (status, headers.get("Allow")) == (405, allow), (method, path, status, body)
        assert headers["Content-Type"] == "application/json"
        if method != "HEAD":
            assert method in json.loads(body)["error"]["message"]
        else:
            assert body == b""
    status, _, body = _ask(endpoint, "OPTIONS", "/nowhere")
    assert status == 404 and "error" in json.loads(body)


def test_a_body_past_the_cap_is_413_and_is_never_read(endpoint):
    """A 100 MB body, or a Content-Length of 10^12 (which used to end with an empty reply and
    a server traceback), is refused from its header with a 413 JSON error, before the body
    is read: the client sends only a little of it here, and gets the answer."""
    for length in (100 * 2**20, 10**12):
        reply = _raw(endpoint, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                     + str(length).encode() + b"\r\n\r\n" + b"x" * 4096)
        assert _status(reply) == 413 and "at most" in _error(reply)
    with_expect = _raw(endpoint, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       b"Expect: 100-continue\r\nContent-Length: 999999999\r\n\r\n")
    assert _status(with_expect) == 413  # no "100 Continue": the body is not asked for


@pytest.mark.parametrize("headers, status", [
    (b"Content-Length: -1\r\n", 400),
    (b"Content-Length: 1e3\r\n", 400),
    (b"Content-Length: 99999999999999999999999999\r\n", 400),
    (b"Content-Length: 2\r\nContent-Length: 3\r\n", 400),
    (b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", 400),
    (b"Transfer-Encoding: gzip\r\n", 501),
    (b"", 411),
])
def test_a_body_framed_wrongly_is_a_json_error_and_the_connection_closes(endpoint, headers,
                                                                        status):
    reply = _raw(endpoint, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + headers
                 + b"\r\n{}", wait_close=True)
    assert _status(reply) == status, reply[:300]
    assert b"Connection: close" in reply and _error(reply)


def test_json_nested_100k_deep_is_a_400_not_an_empty_reply(endpoint):
    for body in (b"[" * 100_000 + b"]" * 100_000, b'{"prompt": ' + b"[" * 5000 + b"]" * 5000
                 + b"}", b'{"prompt": "hi", "max_tokens": NaN}'):
        status, _, reply = _ask(endpoint, "POST", "/v1/completions", body)
        assert status == 400, reply[:300]
        assert "nests" in json.loads(reply)["error"]["message"] or b"NaN" in body


def test_a_chunked_body_is_read(endpoint):
    """Transfer-Encoding: chunked bodies used to be read as empty."""
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 5}).encode()
    chunks = b"".join(b"%x\r\n" % len(body[i:i + 7]) + body[i:i + 7] + b"\r\n"
                      for i in range(0, len(body), 7))
    reply = _raw(endpoint, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\nX-Trailer: 1\r\n\r\n")
    assert _status(reply) == 200, reply[:300]
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["choices"][0]["tokens"] == [0, 1, 2, 3, 4]
    bad = _raw(endpoint, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
               b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", wait_close=True)
    assert _status(bad) == 400 and "chunk" in _error(bad)


def test_a_stalled_connection_is_closed_and_frees_its_thread():
    """A client that stops sending (mid-headers, or mid-body) used to hold its connection and
    thread for good: after the read timeout the server closes it."""
    ep = Endpoint(StandIn(), port=0, read_timeout_s=1.0)
    try:
        for partial in (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro"):
            with socket.create_connection(("127.0.0.1", ep.port), timeout=PATIENCE_S) as s:
                s.sendall(partial)
                t0 = time.monotonic()
                try:
                    while s.recv(65536):
                        pass
                except TimeoutError:
                    pytest.fail(f"still open after {PATIENCE_S:g} s")
                assert time.monotonic() - t0 < patience(PATIENCE_S)
        deadline = time.monotonic() + patience(PATIENCE_S)
        while ep.httpd.open and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ep.httpd.open == 0
        assert _ask(ep, "GET", "/v1/models")[0] == 200
    finally:
        ep.close()


def test_a_burst_of_connections_is_never_reset(endpoint):
    """300 requests, 64 at a time, each on its own connection: none reset (the listen backlog
    was 5)."""
    from concurrent.futures import ThreadPoolExecutor

    body = json.dumps({"prompt": "hello", "max_tokens": 2})

    def one(_):
        try:
            return _ask(endpoint, "POST", "/v1/completions", body)[0]
        except (ConnectionError, http.client.RemoteDisconnected) as exc:
            return type(exc).__name__

    with ThreadPoolExecutor(64) as pool:
        got = list(pool.map(one, range(300)))
    assert got.count(200) == 300, {x: got.count(x) for x in set(got)}
    assert endpoint.httpd.request_queue_size >= 128


def test_a_stopped_coordinator_loop_is_a_503_at_once_and_health_says_so():
    """The coordinator loop stops (here: a bug after one request): /health and /v1/models
    answer 503 with the reason, and a completion request gets a 503 at once, not after the
    request timeout (it used to wait --timeout + 5 s while /v1/models answered 200)."""
    ep = Endpoint(StandIn(fail_after=1), port=0, timeout_s=600)
    try:
        body = json.dumps({"prompt": [1, 2], "max_tokens": 2})
        status, _, reply = _ask(ep, "GET", "/health")
        assert status == 200 and json.loads(reply)["status"] == "ok"
        assert _ask(ep, "POST", "/v1/completions", body)[0] == 200
        t0 = time.monotonic()
        status, _, reply = _ask(ep, "POST", "/v1/completions", body)  # this one kills it
        assert status == 503 and "a bug in the loop" in json.loads(reply)["error"]["message"]
        status, _, reply = _ask(ep, "POST", "/v1/completions", body)
        assert status == 503 and "coordinator loop stopped" in json.loads(reply)["error"][
            "message"]
        assert time.monotonic() - t0 < patience(PATIENCE_S)
        for path in ("/health", "/v1/models"):
            status, _, reply = _ask(ep, "GET", path)
            assert status == 503, path
            assert "coordinator loop stopped" in reply.decode()
    finally:
        ep.close()
