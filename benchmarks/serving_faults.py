"""Workers killed during a replay of `shoal serve run`: what happens to every request.

    python benchmarks/serving_faults.py [--seed 0]

The tiny model (4 blocks) on four workers in two parallel chains with uneven ranges
(a [0,2) -> b [2,4) and c [0,1) -> d [1,4)), greedy decoding of 8 tokens per request, Poisson
arrivals. Two cases: a is SIGKILLed 0.5 s into 60 requests at 40/s (c -> d is left), and a and
c are both SIGKILLed 0.5 s into 40 requests at 20/s (no chain is left). Prints JSON per case:
requests completed, re-run from the prompt, rejected (by reason), whether every completed
request's tokens equal a one-process run, and the wall time. None may hang: each run has a
120 s timeout per request.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from shoal.catalog import TINY
from shoal.serving.cluster import build_cluster
from shoal.serving.flow import max_flow
from shoal.serving.live import LiveServer, reference_generate, requests_from, workload
from shoal.serving.placement import load_placement
from shoal.serving.spec import load_serving

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


def run_case(cl, pl, fl, killed: list[str], n: int, rate: float, seed: int) -> dict:
    reqs = requests_from(workload(TINY, n, rate=rate, max_new=MAX_NEW, seed=seed), TINY)
    ref = reference_generate(TINY, [r.prompt for r in reqs], MAX_NEW)
    with LiveServer(cl, pl, fl, TINY) as srv:
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
    return {"killed": killed, "requests": n, "rate_per_s": rate, "completed": len(done),
            "re_run_from_prompt": sum(r.attempt > 0 for r in reqs), "rejected": why,
            "tokens_equal_reference": all(r.tokens == w[:r.max_new] for r, w in done),
            "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp())
    (d / "s.json").write_text(json.dumps(SERVING))
    (d / "p.json").write_text(json.dumps(PLACEMENT))
    cl = build_cluster(load_serving(d / "s.json"))
    pl = load_placement(d / "p.json", cl)
    fl = max_flow(cl, pl)
    out = [run_case(cl, pl, fl, killed, n, rate, args.seed + i)
           for i, (killed, n, rate) in enumerate(CASES)]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
