"""Plan shapes: a layer split, a microbatch size and the options of each stage, and the
layer re-split to an allocation's slowest replicas."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from shoal.training.planners import sailor
from shoal.training.planners.allocate import (
    Allocation,
    Option,
)
from shoal.training.planners.auto.kernels import min_max_cuts
from shoal.training.planners.space import Space, balanced_split

ALL_SPLITS_UP_TO = 5  # pipeline depths whose every contiguous split is tried ...
MAX_SPLITS = 120  # ... when there are at most this many
PERMUTE_UP_TO = 5  # pipeline depths whose stage orders are permuted (when every split is tried)


def every_split(L: int, P: int) -> bool:
    """Whether every contiguous split of L layers into P > 1 stages is tried: shallow
    pipelines, when the splits are not too many."""
    return 1 < P <= ALL_SPLITS_UP_TO and math.comb(L - 1, P - 1) <= MAX_SPLITS


def splits_for(L: int, P: int) -> list[tuple[tuple[int, int], ...]]:
    """The balanced split, and every contiguous split where ``every_split``."""
    out = [balanced_split(L, P)]
    if every_split(L, P):
        for c in itertools.combinations(range(1, L), P - 1):
            edges = (0, *c, L)
            out.append(tuple((edges[i], edges[i + 1]) for i in range(P)))
    return list(dict.fromkeys(out))


def rebalanced(space: Space, alloc: Allocation, opts: list[list[Option]], L: int, mbs: int,
               recompute: bool) -> tuple[tuple[int, int], ...]:
    """Layers re-split so each stage's slowest replica type takes about equal time: the linear
    partition of the layer list minimising the slowest stage (dynamic program over cuts),
    kept per (GPU, TP) of the stages (``Space.resplits``)."""
    slow = []
    for st, o in zip(alloc.per_stage, opts, strict=True):
        k, tp, _ = st[0] if len(st) == 1 else max(
            st, key=lambda x: next(op.time_s for op in o if op.kind == x[0] and op.tp == x[1]))
        slow.append((space.kinds[k].gpu, tp))
    key = (tuple(slow), L, mbs, recompute)
    if key not in space.resplits:
        space.resplits[key] = linear_partition(space, slow, L, mbs, recompute)
    return space.resplits[key]


def linear_partition(space: Space, slow: list[tuple[str, int]], L: int, mbs: int,
                      recompute: bool) -> tuple[tuple[int, int], ...]:
    """The split of L layers over stages of these (GPU, TP) minimising the slowest stage."""
    P = len(slow)
    cum = np.array([space.tb.cum_step(g, tp, mbs, recompute) for g, tp in slow], dtype=float)
    arg = np.zeros((P, L + 1), dtype=np.int64)
    min_max_cuts(cum, L, arg, np.empty((P, L + 1)))
    edges = [L]
    for i in range(P - 1, 0, -1):
        edges.append(int(arg[i, edges[-1]]))
    edges.append(0)
    edges.reverse()
    return tuple((edges[i], edges[i + 1]) for i in range(P))


@dataclass(frozen=True)
class Shape:
    recompute: bool
    mbs: int
    split: tuple[tuple[int, int], ...]
    opts: tuple[tuple[Option, ...], ...]
    rebalance: bool
    # the `sailor` strategy's options for this shape (each kind at Sailor's TP), on the shapes
    # that strategy plans: balanced splits, its recompute setting
    sailors: tuple[tuple[Option, ...], ...] | None = None


@dataclass(frozen=True)
class OptionTimes:
    """A shape's option times with their least sends (``Bounds.option_times``), the least
    sends per microbatch of any replica (``send_s``) and the least USD/s of one replica of
    every stage (``rate_usd_s``)."""

    times: list[dict[tuple[int, int], float]]
    send_s: float
    rate_usd_s: float
    compute: list[dict[tuple[int, int], float]]  # the options' compute times (their order)
    fwd: list[dict[tuple[int, int], float]]  # their forwards with their least sends


def shapes_of(space: Space, mbs_values: list[int], max_stages: int | None):
    problem = space.problem
    L = problem.n_layers
    settings = sorted(set(problem.job.recompute))
    for recompute in settings:
        for P in range(1, min(L, max_stages or L) + 1):
            for mbs in mbs_values:
                bal = balanced_split(L, P)
                for split in splits_for(L, P):
                    opts = sailor.stage_options(space, split, mbs, recompute, 0, 1, all_tp=True)
                    if opts is None:
                        yield None
                        continue
                    if (recompute and False in settings
                            and fits_without_recompute(space, split, mbs, opts)):
                        yield False  # recompute only slows a shape that already fits
                        continue
                    sailors = None
                    if split == bal and recompute == sailor.recompute_of(problem):
                        # per stage and kind, Sailor's TP (one of the fitting TPs listed)
                        sailors = tuple(tuple(st) for st in sailor.stage_options(
                            space, split, mbs, recompute, 0, 1))
                    yield Shape(recompute, mbs, split, tuple(tuple(o) for o in opts),
                                rebalance=P > 1 and split == bal and not every_split(L, P),
                                sailors=sailors)


def fits_without_recompute(space: Space, split, mbs: int, opts) -> bool:
    """True when, without recompute, every stage already fits each GPU at the same TP."""
    plain = sailor.stage_options(space, split, mbs, False, 0, 1, all_tp=True)
    if plain is None:
        return False
    return all({(o.kind, o.tp) for o in a} == {(o.kind, o.tp) for o in b}
               for a, b in zip(plain, opts, strict=True))


def pad_last(a: np.ndarray, width: int) -> np.ndarray:
    """``a`` (2-D) widened to ``width`` columns by repeating each row's last."""
    if a.shape[1] == width:
        return a
    return np.concatenate([a, np.repeat(a[:, -1:], width - a.shape[1], axis=1)], axis=1)
