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

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from shoal.elastic.names import POLICIES
from shoal.elastic.switch import (
    Running,
    UnderWay,
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


@dataclass(frozen=True, kw_only=True)
class Change:
    """What a policy knows when the pool changes (``choose``): the states so far, this one
    last (``seen``); whether GPUs the running plan holds are gone (``forced``), and the notice
    before they go; the training since the running plan's last checkpoint; switching still
    under way (``pending_s``), whose last ``owed_s`` (seconds at the running plan's speed)
    redo lost work, which a move carries to the new plan; VMs that switch is still starting
    (``booting``), up in ``boot_left_s``, and its checkpoint written in ``save_left_s``
    (``switch_cost``); work lost when the job stopped, redone when it starts again
    (``lost_iterations``); the plans ranked in the states so far (``known``); and when the
    job ends (``end_s``: this long from now; None: a replay's trace has no end of the job)."""

    seen: list[State]
    forced: bool
    notice_s: float
    since_checkpoint_s: float
    pending_s: float = 0.0
    owed_s: float = 0.0
    booting: dict[tuple[str, str], int] = field(default_factory=dict)
    boot_left_s: float = 0.0
    save_left_s: float = 0.0
    lost_iterations: float = 0.0
    known: list[Running] = field(default_factory=list)
    end_s: float | None = None

    def under_way(self) -> UnderWay:
        """What the switch under way leaves a move (before its redo while more is pending
        than owed)."""
        return UnderWay(self.pending_s - self.owed_s > 0, self.booting, self.boot_left_s,
                        self.save_left_s)


def choose(policy: str, problem: Problem, objective: str, cur: Running | None,
           options: list[Running], change: Change) -> Running | None:
    """The plan to run from this change on (``cur`` to keep it); not for ``oracle``.

    ``shoal`` weighs staying (unless forced) and moving to each option by a ``Rollout`` over
    sampled ``Futures`` of the trace, each move's switch included; the plans ranked in the
    states so far (``change.known``) are where the rollouts' forced moves go (the options
    are added)."""
    forced = change.forced
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
    roll = _rollout(problem, objective, change, options)
    choices = [] if (cur is None or forced) else [(cur, change.pending_s)]
    owed = change.owed_s / cur.iteration_time_s if change.owed_s > 0 else 0.0
    under_way = change.under_way()
    choices += [(q, switch_cost(problem, cur, q, forced=forced, notice_s=change.notice_s,
                                since_checkpoint_s=change.since_checkpoint_s,
                                under_way=under_way,
                                lost_iterations=owed + change.lost_iterations).total_s)
                for q in options]
    values = [roll.value(q, c) for q, c in choices]
    best = max(range(len(values)), key=values.__getitem__)
    if best > 0 and not (cur is None or forced) and not roll.clearly_better(choices[best],
                                                                           choices[0]):
        best = 0  # staying: the move's gain is within the futures' noise
    return choices[best][0]


def _rollout(problem: Problem, objective: str, change: Change,
             options: list[Running]) -> Rollout:
    """``shoal``'s rollout at ``change``: futures sampled from the states seen, forced moves to
    the plans known and the options, at the median notice of the losses seen."""
    seen = change.seen
    notices = [st.notice_s for prev, st in zip(seen, seen[1:], strict=False)
               if any(st.avail.get(k, 0) < n for k, n in prev.avail.items())]
    pool = {r.cand.spec: r for r in [*change.known, *options]}
    prior = problem.switching.prior_gap
    return Rollout(problem, objective, Futures(seen, prior, end_s=change.end_s),
                   list(pool.values()), float(np.median(notices)) if notices else 0.0,
                   loss_gaps_s([st.time_s for st in seen], [st.avail for st in seen], prior)[-1])


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
    plans: dict = {}
    for opts in options:
        for r in opts:
            plans.setdefault(r.cand.spec, r)
    runs = list(plans.values())
    n = len(trace.states)
    if not runs:
        return [None] * n
    table = _table(problem, runs)
    K = len(runs) + 1
    ways = _Ways(tokens=np.where(np.arange(K) == 0, 0.0, -np.inf), busy=np.zeros(K),
                 since=np.zeros(K), redo=np.zeros(K),
                 booting=np.zeros((K, table.nodes.shape[1])), boot_left=np.zeros(K),
                 save_left=np.zeros(K))
    durations = trace.durations()
    gaps = loss_gaps_s([st.time_s for st in trace.states], [st.avail for st in trace.states],
                       problem.switching.prior_gap)
    back = np.zeros((n, K), dtype=np.int64)
    for i, st in enumerate(trace.states):
        allowed = None if follow is None else table.index[follow[i]]
        back[i] = _oracle_step(problem, table, ways, (st, durations[i], gaps[i]), allowed)
    # the replay's tokens: less the work lost and not redone by the end
    unrecovered = np.minimum(ways.redo, ways.busy) / table.Tp
    unrecovered[0] = ways.lost0
    per_iter = problem.job.global_batch * problem.job.seq_len
    final = np.where(np.isfinite(ways.tokens), ways.tokens - per_iter * unrecovered, -np.inf)
    q = int(np.argmax(final))
    if totals is not None:
        totals.append(float(final[q]))
    picks = [0] * n
    for i in range(n - 1, -1, -1):
        picks[i] = q
        q = int(back[i, q])
    return [None if j == 0 else runs[j - 1] for j in picks]


class _Table(NamedTuple):
    """The oracle's plans as arrays over them, index 0 the idle job: iteration seconds (``Tq``
    0 for the idle job, which has no iterations to warm up or redo; ``Tp`` 1, a divisor),
    tokens per second, checkpoint save seconds, VMs rented per (GPU type, zone), the start-up
    of new VMs going from plan p to plan q (the idle job holds none) and every part of that
    move but its save, redo and wait (``fixed``)."""

    runs: list[Running]
    index: dict
    Tq: np.ndarray
    Tp: np.ndarray
    thr: np.ndarray
    save: np.ndarray
    nodes: np.ndarray
    startup: np.ndarray
    fixed: np.ndarray


def _table(problem: Problem, runs: list[Running]) -> _Table:
    sw = problem.switching
    K = len(runs) + 1  # index 0: idle
    index = {None: 0, **{r.cand.spec: j for j, r in enumerate(runs, 1)}}
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
    return _Table(runs, index, Tq, Tp, thr, save, nodes, startup, fixed)


@dataclass
class _Ways:
    """Per plan (index 0: the idle job), the best way found to be running it after a state:
    its tokens (-inf: none), switching left, training since its last checkpoint, the redone
    work of its switch under way (its last part), the VMs that switch is still starting, the
    seconds until they are up and until its checkpoint is written; and the iterations the idle
    way owes (lost when it stopped), redone at its next start."""

    tokens: np.ndarray
    busy: np.ndarray
    since: np.ndarray
    redo: np.ndarray
    booting: np.ndarray
    boot_left: np.ndarray
    save_left: np.ndarray
    lost0: float = 0.0


class _Moves(NamedTuple):
    """A state's moves from each way (rows) to each plan (columns): whether the way trains (no
    switch under way but its redo), what a move saves, the iterations lost if the job stops
    there, the redo each move brings, the VMs each way holds that are up, the seconds until a
    move's VMs are up, whether the column stays on the row's plan, and the switching ahead."""

    trains: np.ndarray
    saving: np.ndarray
    stop_lost: np.ndarray
    redo_q: np.ndarray
    up: np.ndarray
    up_s: np.ndarray
    stay: np.ndarray
    c: np.ndarray


def _moves(table: _Table, ways: _Ways, notice_s: float, fit: np.ndarray) -> _Moves:
    """Every way's moves at a state of notice ``notice_s`` where the plans ``fit``, as the
    replay's ``switch_cost``: the redo of a switch under way not done yet is owed by a move; a
    plan that trains (or redoes) saves, or loses the work since its checkpoint; a move waits
    for the checkpoint the switch under way is writing, and for VMs it is still starting when
    it takes some of them, no longer than its own start-up."""
    Tp, save, nodes, startup = table.Tp, table.save, table.nodes, table.startup
    busy, booting, boot_left = ways.busy, ways.booting, ways.boot_left
    can_save = fit | (notice_s >= save)  # p still runs, or its notice covers the save
    owed = np.minimum(ways.redo, busy)
    owed[0] = 0.0
    trains = busy - owed <= 0
    since_it = np.where(trains, np.maximum(ways.since - owed, 0.0) / Tp, 0.0)
    lost = owed / Tp + np.where(can_save, 0.0, since_it)
    lost[0] = ways.lost0
    # a stop saves nothing unless the notice covers the save (the replay's stop)
    stop_lost = owed / Tp + np.where(notice_s >= save, 0.0, since_it)
    stop_lost[0] = ways.lost0
    saving = np.where(trains & can_save, save, 0.0)
    saving[0] = 0.0
    redo_q = lost[:, None] * table.Tq[None, :]
    up = nodes - booting  # VMs each way holds that are up
    takes = ((nodes[None, :, :] > up[:, None, :]) & (booting[:, None, :] > 0)).any(axis=2)
    wait = np.maximum(np.where(trains, 0.0, ways.save_left)[:, None],
                      np.where(takes & (boot_left[:, None] > 0), boot_left[:, None] - startup,
                               0.0))
    move = saving[:, None] + redo_q + table.fixed + wait
    up_s = np.where((startup > 0) | (wait > 0), wait + saving[:, None] + startup, 0.0)
    stay = np.eye(len(Tp), dtype=bool) & fit[:, None]
    c = np.where(stay, busy[:, None], move)  # switching ahead of each way
    c[:, 0] = 0.0
    return _Moves(trains, saving, stop_lost, redo_q, up, up_s, stay, c)


def _oracle_step(problem: Problem, table: _Table, ways: _Ways, at: tuple,
                 allowed: int | None) -> np.ndarray:
    """One state of the oracle's program (``at``: the state, its duration and the mean time
    between GPU losses seen up to it; ``allowed``: the one plan it may run, when it follows a
    given sequence): ``ways`` after the state, and where each came from."""
    st, d, gap = at
    runs, thr = table.runs, table.thr
    K = len(runs) + 1
    fit = np.array([True] + [r.fits(st.avail) for r in runs])
    mv = _moves(table, ways, st.notice_s, fit)
    switching = np.minimum(mv.c, d)
    # each plan's checkpoints at this state's interval: their stalls do not train
    every = np.array([0.0] + [checkpoint_every_s(problem, r, gap) for r in runs])
    share = np.array([1.0] + [training_share(r, e) for r, e in zip(runs, every[1:],
                                                                     strict=True)])
    train = (d - switching) * share[None, :]
    total = ways.tokens[:, None] + thr[None, :] * train
    # less the switching still to come
    value = total - (thr * share)[None, :] * (mv.c - switching)
    value[:, ~fit] = -np.inf
    value[~np.isfinite(ways.tokens), :] = -np.inf
    if allowed is not None:
        value[:, np.arange(K) != allowed] = -np.inf
    best = np.argmax(value, axis=0)
    cols = np.arange(K)
    ways.tokens = np.where(np.isfinite(value[best, cols]), total[best, cols], -np.inf)
    _advance(ways, table, mv, best, (switching[best, cols], train[best, cols], every, d))
    return best


def _advance(ways: _Ways, table: _Table, mv: _Moves, best: np.ndarray, taken: tuple) -> None:
    """``ways`` (but their tokens) after a state of ``d`` seconds where the way to each plan
    comes from way ``best`` of it (``taken``: that way's switching and training in the state,
    the plans' checkpoint intervals, ``d``)."""
    switching, train, every, d = taken
    cols = np.arange(len(best))
    ways.busy = mv.c[best, cols] - switching
    kept = mv.stay[best, cols]
    redone = mv.redo_q[best, cols]
    # redone work is not in the checkpoint the switch saved or loaded
    since = np.where(kept, ways.since[best], redone) + train
    ways.since = np.where(every > 0, np.mod(since, np.where(every > 0, every, 1.0)), 0.0)
    ways.redo = np.where(kept, ways.redo[best], redone)
    ways.lost0 = float(mv.stop_lost[best[0]])
    boot_left = np.maximum(np.where(kept, ways.boot_left[best], mv.up_s[best, cols]) - d, 0.0)
    save_left = np.maximum(np.where(kept | ~mv.trains[best], ways.save_left[best],
                                    mv.saving[best]) - d, 0.0)
    boot_left[0] = save_left[0] = 0.0  # the idle job holds nothing and saves nothing
    ways.booting = np.where((boot_left > 0)[:, None],
                            np.where(kept[:, None], ways.booting[best],
                                     np.maximum(table.nodes - mv.up[best], 0.0)), 0.0)
    ways.boot_left, ways.save_left = boot_left, save_left
