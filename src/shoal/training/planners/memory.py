"""What searches of one problem under different GPU counts teach each other.

For a (plan shape, data-parallel degree) pair, a pool with fewer GPUs of every (type, zone) than
another can only make the pair's best plan worse: the smaller pool's plans are all plans of the
larger one. So the best score a pair reached on a larger pool bounds it on a smaller one, usually
far tighter than the bound from GPU counts alone, and when that plan also fits the smaller pool
it is the pair's answer there. That holds for an exact search; the allocation program is exact
per GPU type and region, but replicas are put into zones by a heuristic, which can do better on
a smaller pool (fewer zones to choose from, fewer bad choices). The bound is therefore lowered by
``SLACK``: pairs within it of the best plan are searched again, and a plan that still fits is
only a starting incumbent. The memory is kept per objective and constraints, since a pair's best
depends on both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shoal.estimate.encode import PlanSpec

Avail = dict[tuple[str, str], int]
PairKey = tuple  # (recompute, microbatch size, layer split, data-parallel degree)
NEAREST = 4  # larger pools consulted per search, the closest in GPU count first
SLACK = 0.05  # what zone placement was seen to gain on a smaller pool is well inside this


def usage(spec: PlanSpec) -> Avail:
    """GPUs a plan holds per (GPU type, zone)."""
    out: Avail = {}
    for _, _, reps in spec[4]:
        for g, tp, z, _ in reps:
            out[(g, z)] = out.get((g, z), 0) + tp
    return out


def fits(need: Avail, avail: Avail) -> bool:
    return all(avail.get(k, 0) >= n for k, n in need.items())


def _contains(big: Avail, small: Avail) -> bool:
    return all(big.get(k, 0) >= n for k, n in small.items() if n > 0)


@dataclass
class PairMemory:
    """Per pool seen: each searched pair's best score (first entry of the objective's sort key)
    and plan (None when no plan of the pair met the constraints)."""

    pools: list[tuple[Avail, dict[PairKey, tuple[float, PlanSpec | None]]]] = field(
        default_factory=list)
    candidates: dict[PlanSpec, object] = field(default_factory=dict)  # spec -> Candidate
    _resolved: dict[PairKey, tuple[float, PlanSpec | None]] = field(default_factory=dict)

    def tighten(self, avail: Avail, pairs: list[PairKey], key: np.ndarray, keep: np.ndarray, ev
                ) -> tuple[np.ndarray, np.ndarray]:
        """Bounds raised by what larger pools reached, and the pairs still to search; a pair's
        best plan on a larger pool that fits this one is given to ``ev`` as a candidate."""
        larger = [(a, t) for a, t in self.pools if _contains(a, avail)]
        larger.sort(key=lambda at: sum(at[0].values()))
        larger = larger[:NEAREST]
        key = key.copy()
        self._resolved = {}
        if not larger:
            return key, keep
        usage_of: dict[PlanSpec, bool] = {}
        for e in np.nonzero(keep)[0]:
            pk = pairs[e]
            for _, table in larger:
                hit = table.get(pk)
                if hit is None:
                    continue
                sc, spec = hit
                key[e] = max(key[e], sc * (1 - SLACK))
                if spec is None:
                    continue
                if spec not in usage_of:
                    usage_of[spec] = fits(usage(spec), avail)
                    if usage_of[spec]:
                        ev.adopt(self.candidates[spec])
                if usage_of[spec]:
                    self._resolved[pk] = hit
                    break
        return key, keep

    def record(self, avail: Avail, found: dict[PairKey, tuple[float, PlanSpec | None]],
               ev) -> None:
        table = {**self._resolved, **found}
        for _, spec in table.values():
            if spec is not None:
                self.candidates.setdefault(spec, ev.feasible[spec])
        self.pools.append((dict(avail), table))
        self._resolved = {}
