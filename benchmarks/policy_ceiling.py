"""How close to `oracle` a policy that cannot see the future can get: a reference policy that
knows the law of the synthetic `scarcity` traces exactly (not their future) and acts optimally
for it, against `shoal`, `always`, `never` and `oracle` on the same plans, one run.

The scarcity generator moves every (GPU type, zone) pair by a random walk: a step every
exponential(`mean_step_s`) seconds, of 1 to `max_step_nodes` nodes, down with
`scarcity_down_p`. So the pool is a Markov chain over the pairs' joint counts, and the job's
choice (which plan to run) makes a Markov decision process. The `informed` policy solves it by
value iteration: the value of running plan q in pool state s is q's tokens over the mean time to
the next change plus, discounted (time constant `--tau`), the best of staying or moving to any plan
that fits the next state, each move's switch (scenario defaults, half a checkpoint interval of
work redone when forced) paid at the new plan's speed. Each plan trains its share of the time
between checkpoints (``switch.training_share``), at the interval the scenario sets for the
law's mean time between GPU losses (the mean time to the next step over the mean chance
that it is a loss, the chance averaged over the pool states). It chooses among every plan ranked in any
state of the trace, as `oracle` does. Jobs and scenarios as `benchmarks/replay.py`.

    python benchmarks/policy_ceiling.py [--capacity 8] [--hours 8] [--seeds 0,1,2] [--tau 7200]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_or_skip  # noqa: E402
from replay import MODELS, scenario  # noqa: E402
from shoal.elastic.policy import Change  # noqa: E402
from shoal.elastic.replan import Replanner  # noqa: E402
from shoal.elastic.replay import plan_trace, simulate  # noqa: E402
from shoal.elastic.switch import (  # noqa: E402
    Running,
    checkpoint_every_s,
    switch_cost,
    training_share,
)
from shoal.elastic.traces import (  # noqa: E402
    _SYNTHETIC_PARAMS,
    _node,
    scarcity_down_p,
    synthetic,
)
from shoal.problem import Problem, load_problem  # noqa: E402


class Informed:
    """The optimal plan choice for the scarcity generator's Markov chain (see the module)."""

    def __init__(self, problem: Problem, runs: list[Running], tau_s: float):
        law = _SYNTHETIC_PARAMS["scarcity"]
        steps = range(1, int(law["max_step_nodes"]) + 1)
        self.keys = sorted(problem.avail)
        caps = [problem.avail[k] for k in self.keys]
        nodes = [_node(problem, k) for k in self.keys]
        levels = []
        for cap, node in zip(caps, nodes, strict=True):
            seen, todo = {cap}, [cap]
            while todo:
                a = todo.pop()
                for b in (min(cap, max(0, a + d * k * node)) for k in steps for d in (-1, 1)):
                    if b not in seen:
                        seen.add(b)
                        todo.append(b)
            levels.append(sorted(seen))
        states = list(itertools.product(*levels))
        self.index = {s: i for i, s in enumerate(states)}
        n_pairs = len(self.keys)
        hold_s = law["mean_step_s"] / n_pairs  # mean time to the next step of any pair
        P = np.zeros((len(states), len(states)))
        for i, s in enumerate(states):
            for j, (cap, node) in enumerate(zip(caps, nodes, strict=True)):
                down = scarcity_down_p(s[j], cap)
                for k in steps:
                    for new, p in ((max(0, s[j] - k * node), down),
                                   (min(cap, s[j] + k * node), 1.0 - down)):
                        nxt = (*s[:j], new, *s[j + 1:])
                        P[i, self.index[nxt]] += p / len(steps) / n_pairs
        self.runs = runs
        self.specs = {r.cand.spec: q for q, r in enumerate(runs, 1)}
        K = len(runs) + 1  # 0: idle
        # the law's mean time between losses, and each plan's checkpoints at its interval
        down = np.mean([np.mean([scarcity_down_p(s[j], caps[j]) for j in range(n_pairs)])
                        for s in states])
        every = [checkpoint_every_s(problem, r, hold_s / down) for r in runs]
        self.thr = np.array([0.0] + [r.tokens_per_s * training_share(r, e)
                                     for r, e in zip(runs, every, strict=True)])
        fit = np.ones((len(states), K), dtype=bool)
        for i, s in enumerate(states):
            avail = dict(zip(self.keys, s, strict=True))
            fit[i, 1:] = [r.fits(avail) for r in runs]
        half = [0.0, *(e / 2 for e in every)]
        cost = {forced: np.array([[0.0] + [
            switch_cost(problem, a, b, forced=forced, notice_s=0.0,
                        since_checkpoint_s=h).total_s for b in runs]
            for a, h in zip([None, *runs], half, strict=True)]) for forced in (False, True)}
        gamma = math.exp(-hold_s / tau_s)
        V = np.zeros((len(states), K))
        diag = np.eye(K, dtype=bool)
        moves = []
        for i in range(len(states)):
            c = np.where(fit[i][:, None], cost[False], cost[True])
            c[diag & fit[i][:, None]] = 0.0  # staying where the plan still fits is free
            moves.append(c * self.thr[None, :])
        for _ in range(10_000):
            W = np.stack([np.where(fit[i][None, :], V[i][None, :] - moves[i], -np.inf).max(axis=1)
                          for i in range(len(states))])
            new = self.thr[None, :] * hold_s + gamma * (P @ W)
            done = np.abs(new - V).max() <= 1e-6 * max(float(np.abs(new).max()), 1.0)
            V = new
            if done:
                break
        self.V = V

    def __call__(self, policy, problem, objective, cur, options, change: Change):
        avail = change.seen[-1].avail
        s = self.index[tuple(avail.get(k, 0) for k in self.keys)]
        best, value = None, -np.inf  # idle only when no plan fits
        if cur is not None and not change.forced:
            q = self.specs[cur.cand.spec]
            best, value = cur, self.V[s, q] - change.pending_s * self.thr[q]
        owed = (change.owed_s / cur.iteration_time_s if cur is not None and change.owed_s > 0
                else 0.0)
        for q, r in enumerate(self.runs, 1):
            if not r.fits(avail) or (cur is not None and r.cand.spec == cur.cand.spec):
                continue
            c = switch_cost(problem, cur, r, forced=change.forced, notice_s=change.notice_s,
                            since_checkpoint_s=change.since_checkpoint_s,
                            under_way=change.under_way(),
                            lost_iterations=owed + change.lost_iterations).total_s
            v = self.V[s, q] - c * self.thr[q]
            if v > value:
                best, value = r, v
        return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=8, help="GPUs per type and zone")
    ap.add_argument("--hours", type=float, default=8.0, help="length of the traces")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    ap.add_argument("--tau", type=float, default=7200.0,
                    help="time constant of the informed policy's discount, seconds")
    args = ap.parse_args()
    ref = reference_or_skip()
    if ref is None:
        return
    zones = {z: {"A100-40GB": args.capacity, "V100-16GB": args.capacity}
             for z in ("us-central1-a", "us-central1-b")}
    policies = ("informed", "shoal", "always", "never", "oracle")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            pb = load_problem(scenario(ref, model, Path(tmp) / model, zones))
            for seed in (int(x) for x in args.seeds.split(",")):
                tr = synthetic(pb, "scarcity", seed=seed, duration_s=args.hours * 3600)
                options = plan_trace(pb, tr, Replanner(pb))
                runs = list({r.cand.spec: r for opts in options for r in opts}.values())
                t0 = time.perf_counter()
                informed = Informed(pb, runs, args.tau)
                solve_s = time.perf_counter() - t0
                tokens = {p: simulate(pb, tr, options, "never" if p == "informed" else p,
                                      chooser=informed if p == "informed" else None).tokens
                          for p in policies}
                name = f"{model}/scarcity-seed{seed}"
                rows[name] = {"states": len(tr.states), "plans": len(runs),
                              "pool_states": len(informed.index), "solve_s": round(solve_s, 2),
                              "tokens": tokens,
                              "over_oracle": {p: tokens[p] / tokens["oracle"] for p in policies}}
                print(json.dumps({name: rows[name]["over_oracle"]}), file=sys.stderr, flush=True)
    summary = {p: {"mean": float(np.mean([r["over_oracle"][p] for r in rows.values()])),
                   "worst": float(min(r["over_oracle"][p] for r in rows.values()))}
               for p in policies}
    print(json.dumps({"capacity": args.capacity, "hours": args.hours, "tau_s": args.tau,
                      "rows": rows, "over_oracle": summary}, indent=1))


if __name__ == "__main__":
    main()
