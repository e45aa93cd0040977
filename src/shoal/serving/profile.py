"""Measure what the serving simulator needs on this machine, with the live workers' own code
(``shoal.serving.live``): the time one transformer block takes for a prompt of n tokens and for
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
will share (the serving file's ``host_cores``).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

PROMPT_TOKENS = (1, 4, 16, 32, 64, 128, 256)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)
MESSAGE_TOKENS = (1, 16, 64, 256)


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

    def write(self, out: Path) -> list[Path]:
        """The two Helix CSVs and ``links.json`` in ``out`` (created), each written whole."""
        from shoal.files import write_json, write_text

        out.mkdir(parents=True, exist_ok=True)
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
    import torch

    from shoal.runtime.profiler import _median_time
    from shoal.serving.live import Shard

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


def _echo(addr_out: str) -> None:
    """A process that sends back every message it receives, as a worker forwards a step; its
    first message is the address it listens on."""
    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(addr_out)
    push.send_pyobj(f"tcp://127.0.0.1:{port}")
    while True:
        msg = pull.recv_pyobj()
        if msg is None:
            break
        push.send_pyobj(msg)
    ctx.destroy(linger=0)


def link_times(hidden: int, *, tokens=MESSAGE_TOKENS, reps: int = 20, dtype: str = "float32"
               ) -> tuple[float, float, int]:
    """(latency s, bandwidth bytes/s, bytes per token) of one hop between two processes,
    fitted to half the round trips of step messages of ``tokens`` tokens."""
    import zmq

    from shoal.serving.live import STEP

    per_token = hidden * np.dtype(dtype).itemsize
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    p = mp.get_context("spawn").Process(target=_echo, daemon=True,
                                        args=(f"tcp://127.0.0.1:{port}",))
    p.start()
    push = ctx.socket(zmq.PUSH)
    xs, ys = [], []
    try:
        if not pull.poll(120_000):
            raise RuntimeError("the echo process did not start")
        push.connect(pull.recv_pyobj())
        for n in tokens:
            msg = {"kind": STEP, "key": (0, 0), "chain": ["a", "b"], "hop": 0, "at": 0,
                   "x": np.zeros((1, n, hidden), dtype=dtype)}
            push.send_pyobj(msg)  # warm-up (and waits for the echo process to start)
            if not pull.poll(60_000):
                raise RuntimeError("the echo process did not answer")
            pull.recv_pyobj()
            rtt = []
            for _ in range(reps):
                t0 = time.perf_counter()
                push.send_pyobj(msg)
                pull.recv_pyobj()
                rtt.append(time.perf_counter() - t0)
            xs.append(n * per_token)
            ys.append(statistics.median(rtt) / 2)
    finally:
        with contextlib.suppress(zmq.Again):  # nothing connected yet if the echo never started
            push.send_pyobj(None, flags=zmq.NOBLOCK)
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
        ctx.destroy(linger=0)
    slope, latency = np.polyfit(np.array(xs, float), np.array(ys, float), 1)
    bandwidth = 1.0 / slope if slope > 0 else float("inf")
    return max(float(latency), 0.0), float(bandwidth), int(per_token)


def coordinator_time(spec, *, reps: int = 50, seed: int = 0, dtype: str = "float32") -> float:
    """Seconds of the coordinator's work per generated token: embed one token, run the head on
    one position, pick the greedy token."""
    import torch

    from shoal.runtime.model import Stage
    from shoal.runtime.profiler import _median_time

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
    lat, bw, per_token = link_times(spec.hidden_size, dtype=dtype)
    return ServingProfile(px, pt, dx, dt, ctx, lat, bw, coordinator_time(spec, seed=seed,
                                                                          dtype=dtype), per_token,
                          len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                          else os.cpu_count() or 1)
