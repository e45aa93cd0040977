"""When to change plans (the replay's policies).

* ``always``: move to the best plan of every new availability state when it is better than the
  plan running (Sailor re-plans and moves at every change).
* ``never``: keep the plan running while its GPUs are there; move only when forced.
* ``shoal``: moves when forced to the plan worth most until the next change, of the state's
  ranking and every plan ranked in an earlier state that fits (the replay passes them);
  chooses to move only when the new plan, over the time it and the running plan are expected
  to last, gains more than its switch (see ``choose``).
* ``oracle``: knows the whole trace; a dynamic program over (state, plan) chooses the plans
  (comparison only).
Every policy moves when GPUs the running plan holds are gone.
"""

from __future__ import annotations

import numpy as np

from shoal.elastic.switch import Running, switch_cost
from shoal.elastic.traces import State, Trace
from shoal.errors import SpecError
from shoal.problem import Problem
from shoal.training.planners.common import score

POLICIES = ("shoal", "always", "never", "oracle")
HORIZON_GAPS = 8  # the longest a plan is expected to last, in mean gaps between changes


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise SpecError("unknown policy", field="--policy", value=name, allowed=", ".join(POLICIES))
    return name


def expected_gap_s(times: list[float], prior_s: float) -> float:
    """Mean gap between the changes seen so far, the prior counting as one gap."""
    gaps = np.diff(times) if len(times) > 1 else np.zeros(0)
    return float((prior_s + gaps.sum()) / (1 + len(gaps)))


def horizon_value(run: Running, horizon_s: float, switch_s: float, objective: str) -> float:
    """What ``run`` is worth over the next ``horizon_s`` after ``switch_s`` of switching:
    tokens, or tokens per dollar when the objective is about cost."""
    tokens = run.tokens_per_s * max(0.0, horizon_s - switch_s)
    if objective == "max-throughput":
        return tokens
    return tokens / max(run.usd_per_s * horizon_s, 1e-12)


class Risk:
    """How likely the next change is to take GPUs a plan holds, learnt from the states so far.

    Per (GPU type, zone): the share of changes that lowered its count (a prior spreads half a
    change over the pairs before anything is seen), and how deep a drop goes, as the share of
    the count lost (the pair's own drops once it has three, else every pair's; before any drop,
    a drop takes all). A plan is cut when a drop leaves fewer GPUs than it holds."""

    def __init__(self, states: list[State]):
        self.now = states[-1].avail
        keys = sorted({k for st in states for k in st.avail})
        self.drops: dict[tuple[str, str], list[float]] = {k: [] for k in keys}
        for prev, st in zip(states, states[1:], strict=False):
            for k in keys:
                a, b = prev.avail.get(k, 0), st.avail.get(k, 0)
                if b < a:
                    self.drops[k].append((a - b) / a)
        self.changes = len(states) - 1
        self.pooled = [f for v in self.drops.values() for f in v]

    def cut_per_change(self, run: Running) -> float:
        prior = 0.5 / max(len(self.drops), 1)
        p = 0.0
        for k, held in run.usage.items():
            drops = self.drops.get(k, [])
            depth = drops if len(drops) >= 3 else self.pooled
            have = self.now.get(k, 0)
            slack = (have - held) / have if have else 0.0  # a deeper drop cuts the plan
            deep = float(np.mean(np.asarray(depth) > slack)) if depth else 1.0
            p += (len(drops) + prior) / (self.changes + 1) * deep
        return min(p, 1.0)


def choose(policy: str, problem: Problem, objective: str, cur: Running | None,
           options: list[Running], *, forced: bool, notice_s: float, since_checkpoint_s: float,
           seen: list[State], pending_s: float = 0.0) -> Running | None:
    """The plan to run from this change on (``cur`` to keep it); not for ``oracle``.

    ``shoal``: a forced move (or a start) takes the option worth most until the next change,
    its switch included; the time to the next change is the mean gap between the changes seen
    so far, with ``switching.prior_gap`` counted as one gap. A move it may choose is compared
    with staying over the time both would last: each plan lasts until a change cuts it (the
    mean gap over its ``Risk`` of a cut per change, at most ``HORIZON_GAPS`` gaps), and the plan
    cut first pays the forced move that follows (redoing half a checkpoint interval unless drops
    have come with notice enough to save)."""
    if not options:
        return None if (forced or cur is None) else cur
    if cur is None or forced:
        if policy != "shoal":
            return options[0]
    elif policy == "never":
        return cur
    elif policy == "always":
        best = options[0]
        return best if score(best.cand, objective) < score(cur.cand, objective) else cur
    sw = problem.switching
    H = expected_gap_s([st.time_s for st in seen], sw.prior_gap)
    costs = [switch_cost(problem, cur, q, forced=forced, notice_s=notice_s,
                         since_checkpoint_s=since_checkpoint_s, pending_s=pending_s).total_s
             for q in options]
    if cur is None or forced:
        return options[int(np.argmax([horizon_value(q, H, c, objective)
                                      for q, c in zip(options, costs, strict=True)]))]
    risk = Risk(seen)
    notices = [st.notice_s for prev, st in zip(seen, seen[1:], strict=False)
               if any(st.avail.get(k, 0) < n for k, n in prev.avail.items())]
    notice = float(np.median(notices)) if notices else 0.0

    def life(q: Running) -> float:
        p = risk.cut_per_change(q)
        return min(H / p if p > 0 else np.inf, HORIZON_GAPS * H)

    def forced_move(q: Running) -> float:
        return switch_cost(problem, q, q, forced=True, notice_s=notice,
                           since_checkpoint_s=sw.checkpoint_interval / 2).total_s

    stay_life = life(cur)
    best, best_gain = cur, 0.0
    for q, c in zip(options, costs, strict=True):
        q_life = life(q)
        window = min(q_life, stay_life)
        move = q.tokens_per_s * (window - c - (forced_move(q) if q_life <= stay_life else 0.0))
        stay = cur.tokens_per_s * (window - pending_s
                                   - (forced_move(cur) if stay_life <= q_life else 0.0))
        if objective != "max-throughput":
            move = move / max(q.usd_per_s, 1e-12)
            stay = stay / max(cur.usd_per_s, 1e-12)
        if move - stay > best_gain:
            best, best_gain = q, move - stay
    return best


def oracle_choices(problem: Problem, trace: Trace, options: list[list[Running]]
                   ) -> list[Running | None]:
    """Plans that maximise the tokens of the whole trace: a dynamic program over the states
    with every plan ranked in any state as a choice (where it fits) and the idle job.

    The program keeps, per plan, the best way found to be running it after each state, with the
    replay's exact accounting (switching carried into the next state, work since the last
    checkpoint); ways are compared by their tokens less what the switching still to come will
    cost, so it is exact up to that one label per plan."""
    sw = problem.switching
    plans: dict = {}
    for opts in options:
        for r in opts:
            plans.setdefault(r.cand.spec, r)
    runs = list(plans.values())
    K = len(runs) + 1  # index 0: idle
    n = len(trace.states)
    if not runs:
        return [None] * n
    T = np.array([np.inf] + [r.iteration_time_s for r in runs])
    Tq = np.where(np.isfinite(T), T, 0.0)  # the idle job has no iterations to warm up or redo
    Tp = np.where(np.isfinite(T), T, 1.0)
    thr = np.array([0.0] + [r.tokens_per_s for r in runs])
    save = np.array([0.0] + [r.save_s for r in runs])
    load = np.array([0.0] + [r.load_s for r in runs])
    keys = sorted({k for r in runs for k in r.nodes})
    nodes = np.zeros((K, len(keys)))
    for j, r in enumerate(runs, 1):
        for k, v in r.nodes.items():
            nodes[j, keys.index(k)] = v
    # new VMs needed going from p to q (the idle job holds none)
    startup = np.where((nodes[None, :, :] > nodes[:, None, :]).any(axis=2), sw.node_startup, 0.0)
    fixed = sw.restart + startup + load[None, :] + sw.warmup_iterations * Tq[None, :]
    durations = trace.durations()
    tokens = np.full(K, -np.inf)
    tokens[0] = 0.0
    busy, since = np.zeros(K), np.zeros(K)
    back = np.zeros((n, K), dtype=np.int64)
    same = np.eye(K, dtype=bool)
    for i, st in enumerate(trace.states):
        d = durations[i]
        fit = np.array([True] + [r.fits(st.avail) for r in runs])
        can_save = fit | (st.notice_s >= save)  # p still runs, or its notice covers the save
        pre = np.where(can_save[:, None], save[:, None], since[:, None] / Tp[:, None] * Tq[None, :])
        pre[0, :] = 0.0
        pre[busy > 0, :] = 0.0  # a switch under way: nothing new to save or redo
        stay = same & fit[:, None]
        move = np.maximum(pre + fixed, busy[:, None])  # no sooner than the one under way
        c = np.where(stay, busy[:, None], move)  # switching ahead of each way
        c[:, 0] = 0.0
        switching = np.minimum(c, d)
        train = d - switching
        total = tokens[:, None] + thr[None, :] * train
        value = total - thr[None, :] * (c - switching)  # less the switching still to come
        value[:, ~fit] = -np.inf
        value[~np.isfinite(tokens), :] = -np.inf
        best = np.argmax(value, axis=0)
        back[i] = best
        cols = np.arange(K)
        tokens = np.where(np.isfinite(value[best, cols]), total[best, cols], -np.inf)
        busy = c[best, cols] - switching[best, cols]
        since = np.where(stay[best, cols], since[best] + train[best, cols],
                         train[best, cols]) % sw.checkpoint_interval
    q = int(np.argmax(np.where(np.isfinite(tokens), tokens - thr * busy, -np.inf)))
    picks = [0] * n
    for i in range(n - 1, -1, -1):
        picks[i] = q
        q = int(back[i, q])
    return [None if j == 0 else runs[j - 1] for j in picks]
