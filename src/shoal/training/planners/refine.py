"""Layer boundaries tuned on a plan's own replicas.

The planners split the layers before or around allocating GPUs (balanced, or re-split to the
allocation's slowest GPUs by their compute alone), so a boundary one or two layers over is
often better once the estimator counts what the split ignores: the sends a stage makes, the
fill and drain of the pipeline, each stage's gradient ring and update (the embedding and the
head have large gradients), and the activations in flight. ``refine`` takes a plan and moves
one boundary at a time by ``MOVES`` layers, or shifts one stage by a layer, every stage
keeping its replicas, zones and microbatch shares, and keeps the best move while it improves
the objective (steepest descent, all moves of a round costed in one estimator batch). Every
plan it costs goes through the search's ``Evaluator``, so the constraints apply and the
statistics count it; of the plans a descent makes, only where it ends stays in the ranking.
"""

from __future__ import annotations

from shoal.estimate.encode import PlanSpec, StageSpec
from shoal.training.planners.common import Candidate, Evaluator, score

MOVES = (-2, -1, 1, 2)  # layers a boundary moves by
ROUNDS = 16  # at most this many improving moves per plan
TOP = 8  # plans ``refine_best`` tunes
PIPELINE_SCHEDULES = ("1f1b", "gpipe")  # the schedules whose plans it tunes (not Zorse's)


def moves(spec: PlanSpec) -> list[PlanSpec]:
    """``spec`` with one stage boundary moved by each of ``MOVES``, and with one inner stage
    shifted by a layer either way (both its boundaries moved together); every stage keeps at
    least one layer."""
    mbs, key, recompute, zero, stages = spec
    edges = [a for a, _, _ in stages] + [stages[-1][1]]
    P = len(stages)
    news = []
    for i in range(1, P):
        for d in MOVES:
            news.append(edges[:i] + [edges[i] + d] + edges[i + 1:])
    for i in range(1, P - 1):
        for d in (-1, 1):
            news.append(edges[:i] + [edges[i] + d, edges[i + 1] + d] + edges[i + 2:])
    return [PlanSpec(mbs, key, recompute, zero, tuple(StageSpec(e[s], e[s + 1], reps)
                                                      for s, (_, _, reps) in enumerate(stages)))
            for e in news if all(x < y for x, y in zip(e, e[1:]))]


def refine(ev: Evaluator, cand: Candidate, objective: str) -> Candidate:
    """``cand`` after its best boundary moves (itself when none improves it). The plans the
    moves made on the way are costed (they count in the search's statistics) but leave the
    ranking again: they are near copies of the tuned plan, which would crowd out the other
    plans a ranking offers (the alternatives a replay moves to, say)."""
    key = (objective, ev.constraints.model_dump_json())
    end = ev.tuned.get((cand.spec, key))
    if end == cand.spec:
        return cand  # a plan these moves no longer improve
    if end is not None:
        # a descent through this plan ended there before: estimates and the moves do not
        # depend on the pool, so this one would end there again
        got = ev.cost([end])[0]
        if got is not None:
            return got
    before = set(ev.feasible)
    best = cand
    path = [cand.spec]
    made = []
    done = False  # no move improves ``best``
    for _ in range(ROUNDS):
        if ev.out_of_time():
            break
        step = None
        for c in ev.cost(moves(best.spec)):
            if c is None:
                continue
            if c.spec not in before:
                made.append(c.spec)
            if score(c, objective) < score(step or best, objective):
                step = c
        if step is None:
            done = True
            break
        best = step
        path.append(best.spec)
    for sp in made:
        if sp != best.spec:
            ev.feasible.pop(sp, None)
    if ev.incumbent is not None and ev.incumbent.spec not in ev.feasible:
        ev.incumbent = best
    if done:
        for sp in path:
            ev.tuned[(sp, key)] = best.spec
    return best


def refine_best(ev: Evaluator, objective: str, top: int = TOP) -> None:
    """The ``top`` best plans found so far (by ``objective``), each tuned by ``refine``."""
    ranked = sorted((c for c in ev.feasible.values()
                     if len(c.spec.stages) > 1 and c.spec.schedule in PIPELINE_SCHEDULES),
                    key=lambda c: score(c, objective))
    for cand in ranked[:top]:
        refine(ev, cand, objective)
