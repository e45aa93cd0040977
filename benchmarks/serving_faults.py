"""Workers killed during a replay of `shoal serve run`, and during a burst of HTTP requests:
what happens to every request.

    python benchmarks/serving_faults.py [--seed 0] [--only replay|http]

The tiny model (4 blocks) on four workers in two parallel chains with uneven ranges
(a [0,2) -> b [2,4) and c [0,1) -> d [1,4)), greedy decoding.

Replay (8 tokens per request, Poisson arrivals): a is SIGKILLed 0.5 s into 60 requests at 40/s
(c -> d is left), and a and c are both SIGKILLed 0.5 s into 40 requests at 20/s (no chain is
left), each with workers not started again (``restarts=0``) and started again (the default,
3). Prints JSON per case: requests completed, re-run from the prompt, rejected (by reason),
whether every completed request's tokens equal a one-process run, and the wall time. None may
hang: each run has a 120 s timeout per request.

HTTP (issue 61's acceptance): 300 requests of 6 tokens, 64 at a time, each on its own
connection to the endpoint on 127.0.0.1 (``--timeout`` 30 s), without a kill and with worker a
SIGKILLed once 100 have been answered. Prints per case: connections reset (or otherwise failed),
answers by status, the slowest answer and the 95th percentile, whether every 200's tokens equal
a one-process run, the wall time, and the workers' restarts and states at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from shoal.catalog import TINY
from shoal.runtime.serve.http import Endpoint
from shoal.runtime.serve.live import LiveOptions, LiveServer
from shoal.runtime.serve.shard import reference_generate
from shoal.runtime.serve.traffic import requests_from, workload
from shoal.serving.cluster import build_cluster
from shoal.serving.flow import max_flow
from shoal.serving.placement import load_placement
from shoal.specs.serving import load_serving

SERVING = {
    "schema": "shoal/serving@1", "name": "tiny on four workers", "model": {"name": "tiny"},
    "machines": {"T4": {"gpu": "T4", "nic_in": "10Gbps", "nic_out": "10Gbps"},
                 "L4": {"gpu": "L4", "nic_in": "10Gbps", "nic_out": "10Gbps"}},
    "nodes": [{"machine": m, "name": n} for m, n in (("L4", "a"), ("T4", "b"), ("T4", "c"),
                                                    ("L4", "d"))],
    "links": {"within": {"bandwidth": "10Gbps", "latency": "1ms"}},
}
PLACEMENT = {"schema": "shoal/serving-placement@1", "layers": 4, "nodes": [
    {"name": "a", "layers": [0, 2]}, {"name": "b", "layers": [2, 4]},
    {"name": "c", "layers": [0, 1]}, {"name": "d", "layers": [1, 4]}]}
CASES = ((["a"], 60, 40.0), (["a", "c"], 40, 20.0))
MAX_NEW = 8
BURST, CONCURRENT, KILL_AFTER, HTTP_NEW, HTTP_TIMEOUT_S = 300, 64, 100, 6, 30.0


def run_case(cl, pl, fl, killed: list[str], n: int, rate: float, seed: int,
             restarts: int) -> dict:
    reqs = requests_from(workload(TINY, n, rate=rate, max_new=MAX_NEW, seed=seed), TINY)
    ref = reference_generate(TINY, [r.prompt for r in reqs], MAX_NEW)
    with LiveServer(cl, pl, fl, TINY, LiveOptions(restarts=restarts)) as srv:
        def kill():
            time.sleep(0.5)
            for name in killed:
                os.kill(srv.procs[name].pid, signal.SIGKILL)

        th = threading.Thread(target=kill)
        th.start()
        t0 = time.perf_counter()
        srv.run(reqs, timeout_s=120)
        wall = time.perf_counter() - t0
        th.join()
    why: dict[str, int] = {}
    for r in reqs:
        if r.rejected is not None:
            why[r.rejected] = why.get(r.rejected, 0) + 1
    done = [(r, want) for r, want in zip(reqs, ref, strict=True) if r.rejected is None]
    return {"case": "replay", "killed": killed, "restarts": restarts, "requests": n,
            "rate_per_s": rate, "completed": len(done),
            "re_run_from_prompt": sum(r.attempt > 0 for r in reqs), "rejected": why,
            "tokens_equal_reference": all(r.tokens == w[:r.max_new] for r, w in done),
            "wall_s": round(wall, 2)}


def http_case(cl, pl, fl, kill: str | None, seed: int) -> dict:
    """``BURST`` completion requests, ``CONCURRENT`` at a time, each on a new connection;
    worker ``kill`` SIGKILLed once ``KILL_AFTER`` have been answered."""
    reqs = requests_from(workload(TINY, BURST, max_new=HTTP_NEW, seed=seed), TINY)
    ref = reference_generate(TINY, [r.prompt for r in reqs], HTTP_NEW)
    answered = threading.Semaphore(0)
    with LiveServer(cl, pl, fl, TINY) as srv:
        ep = Endpoint(srv, port=0, timeout_s=HTTP_TIMEOUT_S)

        def one(i):
            t0 = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=300)
            try:
                conn.request("POST", "/v1/completions", json.dumps(
                    {"prompt": reqs[i].prompt, "max_tokens": HTTP_NEW}))
                resp = conn.getresponse()
                out = resp.status, json.loads(resp.read())
            except (OSError, http.client.HTTPException) as exc:
                out = type(exc).__name__, {}
            finally:
                conn.close()
                answered.release()
            return *out, time.perf_counter() - t0

        def killer():
            for _ in range(KILL_AFTER):
                answered.acquire()
            os.kill(srv.procs[kill].pid, signal.SIGKILL)

        th = threading.Thread(target=killer) if kill else None
        if th:
            th.start()
        t0 = time.perf_counter()
        try:
            with ThreadPoolExecutor(CONCURRENT) as pool:
                got = list(pool.map(one, range(BURST)))
            wall = time.perf_counter() - t0
            if th:
                th.join()
            deadline = time.perf_counter() + 120  # the killed worker back in routing
            while kill and srv.health["workers"][kill]["state"] != "live" and \
                    time.perf_counter() < deadline:
                time.sleep(0.2)
            workers = {n: (w["state"], w["restarts"]) for n, w in srv.health["workers"].items()}
        finally:
            ep.close()
    statuses: dict[str, int] = {}
    for status, _, _ in got:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    lat = np.array([t for _, _, t in got])
    ok = [(doc, ref[i]) for i, (status, doc, _) in enumerate(got) if status == 200]
    return {"case": "http", "killed": [kill] if kill else [], "requests": BURST,
            "concurrent": CONCURRENT, "answers": statuses,
            "failed_connections": sum(not s.isdigit() for s in statuses),
            "errors_503": sorted({doc["error"]["message"] for s, doc, _ in got if s == 503}),
            "slowest_s": round(float(lat.max()), 2),
            "p95_s": round(float(np.percentile(lat, 95)), 2),
            "tokens_equal_reference": all(d["choices"][0]["tokens"] == w[:HTTP_NEW]
                                          for d, w in ok),
            "wall_s": round(wall, 2), "workers_at_end": workers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("replay", "http"))
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp())
    (d / "s.json").write_text(json.dumps(SERVING))
    (d / "p.json").write_text(json.dumps(PLACEMENT))
    cl = build_cluster(load_serving(d / "s.json"))
    pl = load_placement(d / "p.json", cl)
    fl = max_flow(cl, pl)
    out = []
    if args.only != "http":
        out += [run_case(cl, pl, fl, killed, n, rate, args.seed + i, restarts)
                for restarts in (0, 3) for i, (killed, n, rate) in enumerate(CASES)]
    if args.only != "replay":
        out += [http_case(cl, pl, fl, kill, args.seed + 10) for kill in (None, "a")]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
