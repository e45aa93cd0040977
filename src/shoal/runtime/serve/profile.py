"""Measure what the serving simulator needs on this machine, with the live workers' own code
(``shoal.runtime.serve``): the time one transformer block takes for a prompt of n tokens and for
a decode step of a batch of b requests, and the time a message of n tokens' hidden states takes
from one process to another over ZeroMQ.

The block times are written as Helix's per-layer profiles (``prompt_bs2time.csv``,
``decode_bs2time.csv``: tokens or batch size, milliseconds per layer), which a serving file's
machine reads through ``profile:``. A live worker runs the requests of a batch one after the
other, so a decode batch of b takes b single-request steps, each with its own KV cache at the
measured context; that is what is timed. The hop between processes (pickling the message,
ZeroMQ, unpickling) is fitted as ``latency + bytes / bandwidth`` from a ping-pong, and the
coordinator's own work on every token (embedding, output head, greedy choice) is measured too:
``links.json`` gives both, to put in the serving file's ``links``, and the cores the workers
will share (the serving file's ``host_cores``). Two more things of the host go in the serving
file as measured: how fast each of k processes running the workers' steps at once goes against
one alone (``host_share``), and what a message to an idle process and the first step after the
idle time take more than on a busy one, by how long it was idle (``wake``).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import queue
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import zmq

from shoal.files import make_folder, write_json, write_text
from shoal.runtime.model import Stage
from shoal.runtime.profiler import _clock, _median_time
from shoal.runtime.serve.shard import Shard
from shoal.runtime.serve.wire import HELLO, STEP, STOP, recv, send
from shoal.specs.model import ModelSpec

PROMPT_TOKENS = (1, 4, 16, 32, 64, 128, 256)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
MESSAGE_TOKENS = (1, 16, 64, 256)
WAKE_GAPS = (0.002, 0.01, 0.05, 0.25, 1.0)  # idle seconds before a message or a step, for ``wake``
SHARE_PROCESSES = 16  # the most processes ``host_share`` starts
WAKE_PROMPT_TOKENS = 8  # a short step: the extra does not grow with it, the noise does


@dataclass(frozen=True)
class ServingProfile:
    prompt_tokens: list[int]
    prompt_s_per_layer: list[float]
    decode_batch: list[int]
    decode_s_per_layer: list[float]
    context: int  # tokens in each request's KV cache while decode steps were timed
    link_latency_s: float  # one message between two processes
    link_bandwidth_Bps: float  # of the hidden states in the message
    coordinator_s: float  # the coordinator's work per token (embedding, head, choice)
    activation_bytes: int  # bytes of one token's hidden state as the workers send it
    host_cores: int  # cores this process may use: serve run's workers share them (host_cores)
    host_share: list[float]  # each of k processes computing at once: its speed against alone
    wake: dict  # what work reaching an idle process pays (the serving file's ``wake``)

    def write(self, out: Path) -> list[Path]:
        """The two Helix CSVs and ``links.json`` in ``out`` (created), each written whole."""
        make_folder(out)
        rows = [("prompt_bs2time.csv", "tokens", self.prompt_tokens, self.prompt_s_per_layer),
                ("decode_bs2time.csv", "batch", self.decode_batch, self.decode_s_per_layer)]
        paths = []
        for name, x, xs, ts in rows:
            text = f"{x},ms\n" + "".join(f"{a},{t * 1e3:.6f}\n" for a, t in zip(xs, ts, strict=True))
            paths.append(write_text(out / name, text))
        paths.append(write_json(out / "links.json", {
            "schema": "shoal/serving-links@1", **{k: v for k, v in asdict(self).items()
                                                  if k not in ("prompt_tokens", "decode_batch",
                                                               "prompt_s_per_layer",
                                                               "decode_s_per_layer")}}))
        return paths


def block_times(spec, *, prompt_tokens=PROMPT_TOKENS, decode_batch=DECODE_BATCHES,
                context: int | None = None, reps: int = 5, seed: int = 0,
                dtype: str = "float32") -> tuple[list[int], list[float], list[int], list[float], int]:
    """Seconds per block: for a prompt of n tokens (no cache), and for a decode batch of b
    requests run one after the other as a live worker does, each at ``context`` cached tokens
    (default: a quarter of the model's context)."""
    torch.set_num_threads(1)  # as in a worker process
    L = spec.num_layers
    shard = Shard(spec, 0, L, seed=seed, dtype_name=dtype)
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(seed)
    ctx = context or max(1, spec.max_seq_len // 4)
    px = [n for n in prompt_tokens if n <= spec.max_seq_len]
    pt = []
    for n in px:
        x = torch.randn(1, n, spec.hidden_size, generator=gen, dtype=dt).numpy()

        def prompt(x=x):
            shard.step("p", x, 0)
            shard.cache.pop("p")

        pt.append(_median_time(prompt, reps) / L)
    dx = list(decode_batch)
    one = torch.randn(1, 1, spec.hidden_size, generator=gen, dtype=dt).numpy()
    dt_ = []
    for b in dx:
        for r in range(b):  # each request's cache at ``ctx`` tokens
            shard.cache.pop(("d", r), None)
            shard.step(("d", r), torch.randn(1, ctx, spec.hidden_size, generator=gen,
                                             dtype=dt).numpy(), 0)
        snapshot = {r: list(shard.cache[("d", r)]) for r in range(b)}

        def decode(b=b, snapshot=snapshot):
            for r in range(b):
                shard.cache[("d", r)] = list(snapshot[r])  # the same context every repeat
                shard.step(("d", r), one, 0)

        dt_.append(_median_time(decode, reps) / L)
    shard.cache.clear()
    return px, pt, dx, dt_, ctx


def _after_idle(timed, gap: float, reps: int) -> float:
    """Median over ``reps`` pairs of what ``timed()`` (the seconds of one call it makes) takes
    more after ``gap`` seconds idle than at once after: paired, so the machine's drift between
    measurements cancels; at least 0."""
    more = []
    for _ in range(reps):
        time.sleep(gap)
        cold = timed()
        more.append(cold - timed())
    return max(0.0, statistics.median(more))


def wake_times(spec, *, gaps=WAKE_GAPS, reps: int = 5, seed: int = 0, dtype: str = "float32",
               context: int | None = None) -> tuple[list[float], list[float]]:
    """Extra seconds per block of a step that follows an idle time of each of ``gaps``, against
    the same step run right after another: a prompt of ``WAKE_PROMPT_TOKENS`` tokens, and a
    decode step of one request at ``context`` cached tokens."""
    torch.set_num_threads(1)
    L = spec.num_layers
    shard = Shard(spec, 0, L, seed=seed, dtype_name=dtype)
    gen = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    n = min(WAKE_PROMPT_TOKENS, spec.max_seq_len)
    x = torch.randn(1, n, spec.hidden_size, generator=gen, dtype=dt).numpy()
    ctx = context or max(1, spec.max_seq_len // 4)
    shard.step("d", torch.randn(1, ctx, spec.hidden_size, generator=gen, dtype=dt).numpy(), 0)
    past = list(shard.cache["d"])
    one = torch.randn(1, 1, spec.hidden_size, generator=gen, dtype=dt).numpy()

    def prompt():
        shard.step("p", x, 0)
        shard.cache.pop("p")

    def decode():
        shard.cache["d"] = list(past)
        shard.step("d", one, 0)

    out = []
    for step in (prompt, decode):
        step()  # warm-up
        out.append([_after_idle(functools.partial(_clock, step), gap, reps) / L
                     for gap in gaps])
    shard.cache.clear()
    return out[0], out[1]


def _share_worker(i: int, spec_json: str, seed: int, dtype: str, rounds: int, window: float,
                  barrier, results) -> None:
    """One of the processes of ``host_share``: in round k, the first k of them run prompt steps
    for ``window`` seconds and report their steps per second; the others wait."""
    torch.set_num_threads(1)
    spec = ModelSpec.model_validate_json(spec_json)
    shard = Shard(spec, 0, min(2, spec.num_layers), seed=seed, dtype_name=dtype)
    x = np.zeros((1, min(16, spec.max_seq_len), spec.hidden_size), dtype=dtype)

    def step():
        shard.step("p", x, 0)
        shard.cache.pop("p")

    step()
    for k in range(1, rounds + 1):
        barrier.wait()
        if i < k:
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < window:
                step()
                n += 1
            results.put((k, n / (time.perf_counter() - t0)))
    barrier.wait()


def host_share(spec, *, processes: int, window: float = 1.0, seed: int = 0,
               dtype: str = "float32") -> list[float]:
    """Entry k-1: the speed, against one alone, of each of k processes running the workers'
    steps at once (k = 1 .. ``processes``), measured with that many processes started
    together. Where processes outnumber cores, or two share a core's caches or pipelines,
    this is below min(1, cores / k)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [ctx.Process(target=_share_worker, daemon=True, args=(
        i, spec.model_dump_json(), seed, dtype, processes, window, barrier, results))
        for i in range(processes)]
    for p in procs:
        p.start()
    try:
        rates: dict[int, list[float]] = {}
        for _ in range(processes * (processes + 1) // 2):
            try:
                k, r = results.get(timeout=120 + 2 * window * processes)
            except queue.Empty:
                raise RuntimeError(f"the {processes} processes measuring the sharing of the "
                                   "host did not all report") from None
            rates.setdefault(k, []).append(r)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    alone = rates[1][0]
    return [min(1.0, statistics.mean(rates[k]) / alone) for k in range(1, processes + 1)]


def _echo(addr_out: str) -> None:
    """A process that sends back every message it receives, as a worker forwards a step; its
    first message is the address it listens on."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(addr_out)
    send(push, {"kind": HELLO, "worker": "echo", "spawned": True,
                "addr": f"tcp://127.0.0.1:{port}"})
    while True:
        msg = recv(pull)
        if msg["kind"] == STOP:
            break
        send(push, msg)
    ctx.destroy(linger=0)


def link_times(hidden: int, *, tokens=MESSAGE_TOKENS, reps: int = 20, dtype: str = "float32",
               gaps=WAKE_GAPS) -> tuple[float, float, int, list[float]]:
    """(latency s, bandwidth bytes/s, bytes per token, extra s per idle time of ``gaps``) of
    one hop between two processes: latency and bandwidth fitted to half the round trips of step
    messages of ``tokens`` tokens sent one after the other; the extra is what the round trip of
    the smallest message takes more when the receiver has been idle that long (the sender is
    awake)."""
    per_token = hidden * np.dtype(dtype).itemsize
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    p = mp.get_context("spawn").Process(target=_echo, daemon=True,
                                        args=(f"tcp://127.0.0.1:{port}",))
    p.start()
    push = ctx.socket(zmq.PUSH)
    xs, ys, woken = [], [], []
    try:
        if not pull.poll(120_000):
            raise RuntimeError("the echo process did not start")
        push.connect(recv(pull)["addr"])
        for n in tokens:
            msg = {"kind": STEP, "key": (0, 0), "chain": ["a", "b"], "hop": 0, "at": 0,
                   "x": np.zeros((1, n, hidden), dtype=dtype)}
            send(push, msg)  # warm-up
            if not pull.poll(60_000):
                raise RuntimeError("the echo process did not answer")
            recv(pull)

            def ping(msg=msg):
                t0 = time.perf_counter()
                send(push, msg)
                recv(pull)
                return time.perf_counter() - t0

            xs.append(n * per_token)
            ys.append(statistics.median(ping() for _ in range(reps)) / 2)
            if n == tokens[0]:  # the same message to a process idle for a while
                woken = [_after_idle(ping, gap, reps) for gap in gaps]
    finally:
        with contextlib.suppress(zmq.Again):  # nothing connected yet if the echo never started
            send(push, {"kind": STOP}, flags=zmq.NOBLOCK)
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
        ctx.destroy(linger=0)
    slope, latency = np.polyfit(np.array(xs, float), np.array(ys, float), 1)
    bandwidth = 1.0 / slope if slope > 0 else float("inf")
    return max(float(latency), 0.0), float(bandwidth), int(per_token), woken


def coordinator_time(spec, *, reps: int = 50, seed: int = 0, dtype: str = "float32") -> float:
    """Seconds of the coordinator's work per generated token: embed one token, run the head on
    one position, pick the greedy token."""
    dt = getattr(torch, dtype)
    embed = Stage(spec, 0, 1, seed=seed, dtype=dt).requires_grad_(False).layers[0]
    head = Stage(spec, spec.num_layers + 1, spec.num_layers + 2, seed=seed,
                 dtype=dt).requires_grad_(False).layers[0]
    tok = torch.tensor([[1]], dtype=torch.long)

    def step():
        with torch.no_grad():
            x = (embed.tok[tok] + embed.pos[0:1]).numpy()
            int(head(torch.from_numpy(x))[0, -1].argmax())

    return _median_time(step, reps)


def measure(spec, *, reps: int = 5, seed: int = 0, dtype: str = "float32",
            context: int | None = None) -> ServingProfile:
    px, pt, dx, dt, ctx = block_times(spec, reps=reps, seed=seed, dtype=dtype, context=context)
    lat, bw, per_token, hop = link_times(spec.hidden_size, dtype=dtype)
    wp, wd = wake_times(spec, reps=reps, seed=seed, dtype=dtype, context=ctx)
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    share = host_share(spec, processes=min(cores + 2, SHARE_PROCESSES), window=0.2 * reps,
                       seed=seed, dtype=dtype)
    return ServingProfile(px, pt, dx, dt, ctx, lat, bw, coordinator_time(spec, seed=seed,
                                                                          dtype=dtype), per_token,
                          cores, share,
                          {"gap_s": list(WAKE_GAPS), "hop_s": hop, "prompt_s_per_layer": wp,
                           "decode_s_per_layer": wd})
