"""When to change plans (the replay's policies).

* ``always``: move to the best plan of every new availability state when it is better than the
  plan running (Sailor re-plans and moves at every change).
* ``never``: keep the plan running while its GPUs are there; move only when forced.
* ``shoal``: looks ahead. At every change it samples continuations of the trace from the
  changes seen so far (``Futures``) and plays each choice out on them (``Rollout``): stay, or
  move to one of the state's ranked plans (when forced, also to any plan ranked in an earlier
  state that fits; the replay passes them), each move's switch included, and every later cut
  paid as a forced move to the known plan that fits and is worth most over a mean gap. It
  takes the choice worth most, but moves by choice only when the move beats staying by more
  than ``SIGNIFICANCE`` standard errors of their difference over the futures.
* ``oracle``: knows the whole trace; a dynamic program over (state, plan) chooses the plans
  (comparison only).
Every policy moves when GPUs the running plan holds are gone.
"""

from __future__ import annotations

import numpy as np

from shoal.elastic.names import POLICIES
from shoal.elastic.switch import (
    Running,
    checkpoint_every_s,
    loss_gaps_s,
    switch_cost,
    training_share,
)
from shoal.elastic.traces import State, Trace
from shoal.errors import SpecError
from shoal.problem import Problem
from shoal.training.planners.common import score

# how far ahead ``shoal`` looks, in mean gaps between changes (benchmarks/replay.py, seed 0 and
# seeds 1-2, at SIGNIFICANCE 3: 5 against 2, 3, 4, 6, 8 and 12; BENCHMARKS.md)
HORIZON_GAPS = 5
FUTURES = 64  # continuations of the trace ``shoal`` samples at each decision
# a move by choice must beat staying by this many standard errors over the futures: a switch
# is paid for sure, its gain only on average (benchmarks/replay.py, seed 0 and seeds 1-2, with
# checkpoints at Young's interval: 3 against 1, 1.5, 2, 2.5, 4 and 5; BENCHMARKS.md)
SIGNIFICANCE = 3.0


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise SpecError("unknown policy", field="--policy", value=name, allowed=", ".join(POLICIES))
    return name


def gaps_seen(times: list[float], prior_s: float) -> np.ndarray:
    """The gaps between the changes seen so far, with the prior as one more gap."""
    return np.concatenate([[prior_s], np.diff(times)])


def expected_gap_s(times: list[float], prior_s: float) -> float:
    """Mean gap between the changes seen so far, the prior counting as one gap."""
    return float(gaps_seen(times, prior_s).mean())


class Futures:
    """Continuations of a trace sampled from its own past, for ``shoal`` to weigh plans on.

    The gap to each next change is one of the gaps seen so far, drawn at random, with the
    scenario's ``switching.prior_gap`` counted as one of them. Each change repeats one of the
    changes seen, drawn at random: the same difference in GPUs for every (GPU type, zone), the
    count kept between 0 and the most that pair has had. Before any change is seen the pool is
    taken to stay as it is. The futures run ``HORIZON_GAPS`` mean gaps (``expected_gap_s``)
    ahead, or to ``end_s`` when the job ends sooner (a live run's steps left); the seed comes
    from the state, so a replay is repeatable."""

    def __init__(self, seen: list[State], prior_gap_s: float, n: int = FUTURES,
                 end_s: float | None = None):
        self.keys = list(seen[-1].avail)
        now = np.array([seen[-1].avail[k] for k in self.keys], dtype=float)
        cap = np.array([max(st.avail.get(k, 0) for st in seen) for k in self.keys], dtype=float)
        deltas = np.array([[st.avail.get(k, 0) - prev.avail.get(k, 0) for k in self.keys]
                           for prev, st in zip(seen, seen[1:], strict=False)], dtype=float)
        gaps = gaps_seen([st.time_s for st in seen], prior_gap_s)
        self.gap_s = float(gaps.mean())
        self.horizon_s = HORIZON_GAPS * self.gap_s
        if end_s is not None:  # the job ends sooner: nothing after it counts
            self.horizon_s = min(self.horizon_s, end_s)
        rng = np.random.default_rng([len(seen), int(seen[-1].time_s)])
        self.paths: list[list[tuple[float, np.ndarray]]] = []
        for _ in range(n):
            t, a, path = 0.0, now, []
            while len(deltas):
                t += gaps[rng.integers(len(gaps))]
                if t >= self.horizon_s:
                    break
                a = np.clip(a + deltas[rng.integers(len(deltas))], 0.0, cap)
                path.append((t, a))
            self.paths.append(path)

    def vector(self, run: Running) -> np.ndarray:
        return np.array([run.usage.get(k, 0) for k in self.keys], dtype=float)


class Rollout:
    """What a plan is worth over the sampled futures: it runs until a change takes GPUs it
    holds, then the job makes the forced move to the plan known that fits and is worth most
    over a mean gap, its move included (idle while none fits), and so on to the horizon. A
    forced move saves when the notices seen so far (their median) cover the save, else redoes
    half the old plan's checkpoint interval; every plan trains its share of the time outside
    switching (``switch.training_share``), its checkpoints at the interval for the mean time
    between GPU losses seen (``loss_gap_s``). Tokens, or tokens per dollar for the cost
    objectives, averaged over the futures (the same futures for every plan weighed)."""

    def __init__(self, problem: Problem, objective: str, futures: Futures,
                 known: list[Running], notice_s: float, loss_gap_s: float | None = None):
        self.problem, self.objective, self.f = problem, objective, futures
        # the mean time between GPU losses seen (none given: the prior gap, no loss yet)
        self.loss_gap_s = problem.switching.prior_gap if loss_gap_s is None else loss_gap_s
        self._every: dict[int, tuple[float, float]] = {}
        self.known = sorted(known, key=lambda r: score(r.cand, objective))  # ties: the better
        self.usage = np.array([futures.vector(r) for r in self.known]).reshape(
            len(self.known), len(futures.keys))
        self.notice_s = notice_s
        self._moves: dict[tuple[int, int], float] = {}
        self._paths: dict[tuple[int, float], np.ndarray] = {}

    def _checkpoints(self, run: Running) -> tuple[float, float]:
        """(training seconds between ``run``'s checkpoints, the share of its time outside
        switching that trains)."""
        got = self._every.get(id(run))
        if got is None:
            every = checkpoint_every_s(self.problem, run, self.loss_gap_s)
            got = self._every[id(run)] = (every, training_share(run, every))
        return got

    def _forced(self, old: Running | None, new: Running) -> float:
        key = (id(old), id(new))
        if key not in self._moves:
            since = 0.0 if old is None else self._checkpoints(old)[0] / 2
            self._moves[key] = switch_cost(
                self.problem, old, new, forced=True, notice_s=self.notice_s,
                since_checkpoint_s=since).total_s
        return self._moves[key]

    def _fallback(self, old: Running | None, avail: np.ndarray) -> Running | None:
        """The forced move's target: of the known plans that fit ``avail``, the one worth most
        over a mean gap, its move from ``old`` included (the objective's ranking breaks ties)."""
        best, worth = None, -np.inf
        for j in np.flatnonzero((self.usage <= avail).all(axis=1)):
            q = self.known[j]
            w = (q.tokens_per_s * self._checkpoints(q)[1]
                 * max(0.0, self.f.gap_s - self._forced(old, q)))
            if self.objective != "max-throughput":
                w /= max(q.usd_per_s * self.f.gap_s, 1e-12)
            if w > worth:
                best, worth = q, w
        return best

    def value(self, run: Running, switch_s: float) -> tuple[float, float]:
        """(what the objective ranks by, tokens): tokens, or tokens per dollar (infinite when
        nothing is paid, so that tokens break the tie) for the cost objectives; averaged."""
        per_path = self.paths(run, switch_s)
        tokens, usd = per_path.sum(axis=0)
        per_usd = tokens / usd if usd > 0 else np.inf
        tokens /= len(self.f.paths)
        return (tokens if self.objective == "max-throughput" else per_usd), tokens

    def clearly_better(self, move: tuple[Running, float], stay: tuple[Running, float]) -> bool:
        """Whether ``move`` (a plan and its switch) beats ``stay`` by more than ``SIGNIFICANCE``
        standard errors of their difference over the same futures (tokens, or tokens per
        dollar for the cost objectives, future by future)."""
        a, b = self.paths(*move), self.paths(*stay)
        if self.objective == "max-throughput":
            d = a[:, 0] - b[:, 0]
        else:
            d = a[:, 0] / np.maximum(a[:, 1], 1e-12) - b[:, 0] / np.maximum(b[:, 1], 1e-12)
        if len(d) < 2:
            return bool(d.mean() > 0)
        return bool(d.mean() > SIGNIFICANCE * d.std(ddof=1) / np.sqrt(len(d)))

    def paths(self, run: Running, switch_s: float) -> np.ndarray:
        """(futures, 2): the tokens and USD of each future (kept per plan and switch)."""
        key = (id(run), switch_s)
        if key not in self._paths:
            self._paths[key] = self._play(run, switch_s)
        return self._paths[key]

    def _play(self, run: Running, switch_s: float) -> np.ndarray:
        out = np.zeros((len(self.f.paths), 2))
        need = self.f.vector(run)
        for i, path in enumerate(self.f.paths):
            tokens = usd = 0.0
            t, plan, held, busy = 0.0, run, need, switch_s
            for until, avail in [*path, (self.f.horizon_s, None)]:
                if plan is not None:
                    span = until - t
                    train = max(0.0, span - busy) * self._checkpoints(plan)[1]
                    busy = max(0.0, busy - span)
                    tokens += plan.tokens_per_s * train
                    usd += (plan.usd_per_s * span
                            + plan.egress_usd_per_iter * train / plan.iteration_time_s)
                t = until
                if avail is None:
                    break
                if plan is None or (held > avail).any():
                    nxt = self._fallback(plan, avail)
                    if nxt is not None:
                        busy = self._forced(plan, nxt)
                        held = self.f.vector(nxt)
                    plan = nxt
            out[i] = tokens, usd
        return out


def choose(policy: str, problem: Problem, objective: str, cur: Running | None,
           options: list[Running], *, forced: bool, notice_s: float, since_checkpoint_s: float,
           seen: list[State], pending_s: float = 0.0, owed_s: float = 0.0,
           known: list[Running] | None = None, booting: dict | None = None,
           boot_left_s: float = 0.0, save_left_s: float = 0.0,
           lost_iterations: float = 0.0, end_s: float | None = None) -> Running | None:
    """The plan to run from this change on (``cur`` to keep it); not for ``oracle``.
    ``pending_s``: switching still under way, whose last ``owed_s`` (seconds at ``cur``'s
    speed) redo lost work, which a move carries to the new plan; ``booting``: VMs that
    switch is still starting, up in ``boot_left_s``, and its checkpoint written in
    ``save_left_s`` (``switch_cost``); ``lost_iterations``:
    work lost when the job stopped, redone when it starts again; ``end_s``: the job ends this
    long from now (the futures stop there; a replay's trace has no end of the job).

    ``shoal`` weighs staying (unless forced) and moving to each option by a ``Rollout`` over
    sampled ``Futures`` of the trace, each move's switch included; ``known``: the plans ranked
    in the states so far, where the rollouts' forced moves go (the options are added)."""
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
    notices = [st.notice_s for prev, st in zip(seen, seen[1:], strict=False)
               if any(st.avail.get(k, 0) < n for k, n in prev.avail.items())]
    pool = {r.cand.spec: r for r in [*(known or []), *options]}
    prior = problem.switching.prior_gap
    roll = Rollout(problem, objective, Futures(seen, prior, end_s=end_s), list(pool.values()),
                   float(np.median(notices)) if notices else 0.0,
                   loss_gaps_s([st.time_s for st in seen], [st.avail for st in seen], prior)[-1])
    choices = [] if (cur is None or forced) else [(cur, pending_s)]
    owed = owed_s / cur.iteration_time_s if owed_s > 0 else 0.0
    choices += [(q, switch_cost(problem, cur, q, forced=forced, notice_s=notice_s,
                                since_checkpoint_s=since_checkpoint_s,
                                under_way=pending_s - owed_s > 0, booting=booting,
                                boot_left_s=boot_left_s, save_left_s=save_left_s,
                                lost_iterations=owed + lost_iterations).total_s)
                for q in options]
    values = [roll.value(q, c) for q, c in choices]
    best = max(range(len(values)), key=values.__getitem__)
    if best > 0 and not (cur is None or forced) and not roll.clearly_better(choices[best],
                                                                           choices[0]):
        best = 0  # staying: the move's gain is within the futures' noise
    return choices[best][0]


def oracle_choices(problem: Problem, trace: Trace, options: list[list[Running]],
                   totals: list | None = None, follow: list | None = None
                   ) -> list[Running | None]:
    """Plans that maximise the tokens of the whole trace: a dynamic program over the states
    with every plan ranked in any state as a choice (where it fits) and the idle job
    (``totals``: a list the program appends its tokens for the plans chosen to, which the
    replay of those plans must count too; ``follow``: the plan specs, None for idle, it must
    choose state by state, to weigh a given sequence instead).

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
    index = {None: 0, **{r.cand.spec: j for j, r in enumerate(runs, 1)}}
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
    gaps = loss_gaps_s([st.time_s for st in trace.states], [st.avail for st in trace.states],
                       sw.prior_gap)
    share = np.ones(K)
    tokens = np.full(K, -np.inf)
    tokens[0] = 0.0
    busy, since = np.zeros(K), np.zeros(K)
    redo = np.zeros(K)  # the redone work of each way's switch under way (its last part)
    booting = np.zeros((K, len(keys)))  # VMs each way's switch under way is still starting ...
    boot_left = np.zeros(K)  # ... and the seconds until they are up
    save_left = np.zeros(K)  # seconds until the checkpoint of each way's switch is written
    per_iter = problem.job.global_batch * problem.job.seq_len
    lost0 = 0.0  # iterations the idle way owes (lost when it stopped), redone at its next start
    back = np.zeros((n, K), dtype=np.int64)
    same = np.eye(K, dtype=bool)
    for i, st in enumerate(trace.states):
        d = durations[i]
        fit = np.array([True] + [r.fits(st.avail) for r in runs])
        can_save = fit | (st.notice_s >= save)  # p still runs, or its notice covers the save
        # as the replay's switch_cost: the redo of a switch under way not done yet is owed by
        # a move; a plan that trains (or redoes) saves, or loses the work since its checkpoint
        owed = np.minimum(redo, busy)
        owed[0] = 0.0
        trains = busy - owed <= 0
        since_it = np.where(trains, np.maximum(since - owed, 0.0) / Tp, 0.0)
        lost = owed / Tp + np.where(can_save, 0.0, since_it)
        lost[0] = lost0
        # a stop saves nothing unless the notice covers the save (the replay's stop)
        stop_lost = owed / Tp + np.where(st.notice_s >= save, 0.0, since_it)
        stop_lost[0] = lost0
        saving = np.where(trains & can_save, save, 0.0)
        saving[0] = 0.0
        redo_q = lost[:, None] * Tq[None, :]
        # as switch_cost: a move waits for the checkpoint the switch under way is writing,
        # and for VMs it is still starting when it takes some of them, no longer than its own
        # start-up
        up = nodes - booting  # VMs each way holds that are up
        takes = ((nodes[None, :, :] > up[:, None, :]) & (booting[:, None, :] > 0)).any(axis=2)
        wait = np.maximum(np.where(trains, 0.0, save_left)[:, None],
                          np.where(takes & (boot_left[:, None] > 0), boot_left[:, None] - startup,
                                   0.0))
        move = saving[:, None] + redo_q + fixed + wait
        up_s = np.where((startup > 0) | (wait > 0), wait + saving[:, None] + startup, 0.0)
        stay = same & fit[:, None]
        c = np.where(stay, busy[:, None], move)  # switching ahead of each way
        c[:, 0] = 0.0
        switching = np.minimum(c, d)
        # each plan's checkpoints at this state's interval: their stalls do not train
        every = np.array([0.0] + [checkpoint_every_s(problem, r, gaps[i]) for r in runs])
        share = np.array([1.0] + [training_share(r, e) for r, e in zip(runs, every[1:],
                                                                         strict=True)])
        train = (d - switching) * share[None, :]
        total = tokens[:, None] + thr[None, :] * train
        # less the switching still to come
        value = total - (thr * share)[None, :] * (c - switching)
        value[:, ~fit] = -np.inf
        value[~np.isfinite(tokens), :] = -np.inf
        if follow is not None:
            value[:, np.arange(K) != index[follow[i]]] = -np.inf
        best = np.argmax(value, axis=0)
        back[i] = best
        cols = np.arange(K)
        tokens = np.where(np.isfinite(value[best, cols]), total[best, cols], -np.inf)
        busy = c[best, cols] - switching[best, cols]
        kept = stay[best, cols]
        redone = redo_q[best, cols]
        # redone work is not in the checkpoint the switch saved or loaded
        since = np.where(kept, since[best], redone) + train[best, cols]
        since = np.where(every > 0, np.mod(since, np.where(every > 0, every, 1.0)), 0.0)
        redo = np.where(kept, redo[best], redone)
        lost0 = float(stop_lost[best[0]])
        boot_left = np.maximum(np.where(kept, boot_left[best], up_s[best, cols]) - d, 0.0)
        save_left = np.maximum(np.where(kept | ~trains[best], save_left[best], saving[best])
                               - d, 0.0)
        boot_left[0] = save_left[0] = 0.0  # the idle job holds nothing and saves nothing
        booting = np.where((boot_left > 0)[:, None],
                           np.where(kept[:, None], booting[best],
                                    np.maximum(nodes - up[best], 0.0)), 0.0)
    # the replay's tokens: less the work lost and not redone by the end
    unrecovered = np.minimum(redo, busy) / Tp
    unrecovered[0] = lost0
    final = np.where(np.isfinite(tokens), tokens - per_iter * unrecovered, -np.inf)
    q = int(np.argmax(final))
    if totals is not None:
        totals.append(float(final[q]))
    picks = [0] * n
    for i in range(n - 1, -1, -1):
        picks[i] = q
        q = int(back[i, q])
    return [None if j == 0 else runs[j - 1] for j in picks]
