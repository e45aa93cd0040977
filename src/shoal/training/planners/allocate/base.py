"""The allocation program's types: options, allocations, mixes of options, the slack of
the slower pipelines."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import numpy as np

BIG = np.int64(1) << 60  # no allocation (the dynamic program's fronts)
MEMO_POOLS = 6  # pools remembered per PoolMemo key
DP_KINDS = 2  # up to this many kinds the program is the dynamic program, above it a MIP
# the MIPs are small and mostly solved at the root, where HiGHS's feasibility-jump heuristic
# costs time and finds no better optimum (benchmarks/NOTES.md, the allocation MIP)
MIP_OPTIONS = {"mip_heuristic_run_feasibility_jump": False}
COMBO_COLUMNS_PER_OPTION = 4  # how the MIP's form is chosen (``by_choices``) ...
ONE_REGION_COMBOS = 2.5  # ... on one region
COMBO_CACHE = 16_384  # stages' combos kept (``combos_of``)
GREEDY_ORDERS = 16  # stage orders the quick fill tries (``greedy``)
LAZY_ROUNDS = 4  # MIPs holding more and more stages to the mixing rules (``solve_mip``)
# an LP vertex this close to integers is read as the integers (``mip_solve``; the model's
# rows are then checked on the integers themselves)
LP_INTEGRAL_TOL = 1e-6


class OutOfTime(Exception):
    """A program passed its caller's deadline (``time.perf_counter`` seconds); nothing of it
    is kept."""


class Option(NamedTuple):
    """One way to run a stage's replica (a tuple: options key the programs' caches, hashed
    often)."""

    kind: int  # index into the kinds
    tp: int
    time_s: float  # per microbatch, forward + backward, one replica


class Pool(NamedTuple):
    """The GPUs an allocation takes from, per kind (GPU type in a region): how many there
    are, their USD per GPU-hour, and each kind's region."""

    avail: np.ndarray
    price: np.ndarray
    region_of: list[int]


class Bound(NamedTuple):
    """A bound on the slowest replica's time per microbatch (``tau``), and the slack of the
    pipelines that run one microbatch fewer (``slots``: ``relax`` times slower, all but
    ``extra`` of the D pipelines)."""

    tau: float
    relax: float
    extra: int


@dataclass(frozen=True)
class Allocation:
    per_stage: tuple[tuple[tuple[int, int, int], ...], ...]  # per stage: (kind, tp, count)
    usage: tuple[int, ...]
    bottleneck_s: float


class Mixes:
    """A stage's combos as arrays, over options of kinds and TPs ``kind_tp``: combo ``c`` puts
    ``na[c]`` replicas on option ``ia[c]`` and the rest on option ``ib[c]`` (-1: all on
    ``ia[c]``); ``self[c]`` is the combo as an allocation's stage ((kind, TP, count), ...).
    The combos depend on the options' kinds and TPs only, so stages of the same kinds and TPs
    share one (``mixes_of``)."""

    __slots__ = ("kind_tp", "ia", "ib", "na", "D", "_entries")

    def __init__(self, kind_tp: tuple[tuple[int, int], ...], ia: np.ndarray, ib: np.ndarray,
                 na: np.ndarray, D: int):
        self.kind_tp, self.ia, self.ib, self.na, self.D = kind_tp, ia, ib, na, D
        self._entries: dict[int, tuple[tuple[tuple[int, int, int], ...], int]] = {}

    def entry(self, c: int) -> tuple[tuple[tuple[int, int, int], ...], int]:
        """``self[c]`` and the GPUs it takes of the first kind (kept)."""
        got = self._entries.get(c)
        if got is None:
            a, b, n = int(self.ia[c]), int(self.ib[c]), int(self.na[c])
            mix = ((*self.kind_tp[a], n),) if b < 0 else ((*self.kind_tp[a], n),
                                                          (*self.kind_tp[b], self.D - n))
            got = self._entries[c] = (mix, sum(m * tp for k, tp, m in mix if k == 0))
        return got

    def __len__(self) -> int:
        return len(self.ia)

    def __getitem__(self, c: int) -> tuple[tuple[int, int, int], ...]:
        return self.entry(c)[0]


def slots(D: int, total: int | None) -> tuple[float, int]:
    """(relax, extra): ``extra`` of the D pipelines run one microbatch more than the rest (the
    fastest replicas' pipelines); a replica on one of the others may be ``relax`` times slower
    than the bound and still finish its microbatches as early."""
    if not total or total < D:
        return 1.0, 0
    lo, extra = divmod(total, D)
    return ((lo + 1) / lo if extra else 1.0), extra


WEIGHT_VALUES = (0, 1, 2, 4, 8)  # per-kind weights of the LP dual bounds ...
WEIGHT_GRID_UP_TO = 4  # ... in every combination up to this many kinds (``kind_weights``)


@cache
def kind_weights(K: int) -> np.ndarray:
    """(W, K) weightings of the kinds at which LP dual bounds on GPU counts are taken: every
    vector of WEIGHT_VALUES per kind when kinds are few (TP degrees are powers of two, so for
    two kinds these hold the dual's optimum), else every 0/1 vector, or each kind alone, all
    but one, and all. Any nonnegative weights give a valid bound."""
    if K <= WEIGHT_GRID_UP_TO:
        grid = np.array(list(itertools.product(WEIGHT_VALUES, repeat=K)), dtype=float)
    elif K <= 8:
        grid = np.array(list(itertools.product((0.0, 1.0), repeat=K)))
    else:
        eye = np.eye(K)
        grid = np.vstack([eye, 1 - eye, np.ones((1, K))])
    return grid[grid.sum(axis=1) > 0]


def allocation_of(per_stage: list | None, K: int, tau: float) -> Allocation | None:
    if per_stage is None:
        return None
    usage = np.zeros(K, dtype=np.int64)
    for mix in per_stage:
        for k, tp, n in mix:
            usage[k] += tp * n
    return Allocation(tuple(per_stage), tuple(int(u) for u in usage), tau)


def caps(avail: np.ndarray) -> tuple[int, int]:
    return int(avail[0]), int(avail[1]) if len(avail) > 1 else 0
