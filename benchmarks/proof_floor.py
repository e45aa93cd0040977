"""What `shoal plan`'s search costs once it knows its answer: the proof, one run.

For each of Sailor's pools of `planner_speed.py`, the command's own search
(``cli.plan._searches``: the search under the objective and the front's searches, the longest
in a copy of the process, at the default budget) twice per round, alternating:

- `as_shipped`: as the command runs it;
- `answer_first`: every search first costs its own final best plan (found by a run of that
  search beforehand), then searches as usual. From its first millisecond the incumbent is the
  answer, so what is left is proving that nothing beats it: no search order and no better
  incumbent can take the search below this time.

The costing happens where each search starts its strategy (``planners._run``, wrapped here for
the measurement only); the front's copy is forked from this process, so it is wrapped too.
Prints seconds and plans costed per round.

    python benchmarks/proof_floor.py [--only NAME] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_dir  # noqa: E402
from planner_speed import scenario  # noqa: E402
from shoal.cli import plan as plan_cmd  # noqa: E402
from shoal.problem import load_problem  # noqa: E402
from shoal.training import planners  # noqa: E402
from shoal.training.planners import OBJECTIVES, Limits, search  # noqa: E402

POOLS = ("gptneo_128a_384v", "opt350_128a_384v", "opt350_5zones_128a")  # Sailor's search timed
BUDGET_S = 60.0  # the command's default


def command(path: Path) -> tuple[float, int]:
    """Seconds and plans costed of the command's search on scenario ``path``."""
    pb = load_problem(path)
    t = time.perf_counter()
    res = plan_cmd._searches(pb, "auto", None, pb.constraints, 5, BUDGET_S)
    return time.perf_counter() - t, res.stats.candidates_costed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, choices=POOLS)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    ref = reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "../shared/reference not found"}))
        return
    run = planners._run
    answers: dict = {}
    answer_first = [False]

    def first_the_answer(ctx, *rest):
        if answer_first[0]:
            ctx.state.cost([answers[ctx.objective]])
        return run(ctx, *rest)

    planners._run = first_the_answer
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in POOLS:
            if args.only and args.only != name:
                continue
            path = scenario(ref / "sailor", name, Path(tmp) / name)
            pb = load_problem(path)
            for goal in OBJECTIVES:  # each search's own answer
                answers[goal] = search(pb, objective=goal, top_k=1,
                                       limits=Limits(budget_s=BUDGET_S)).ranked[0].spec
            command(path)  # the compiled loops loaded, as in a long-running process
            row: dict = {"as_shipped": [], "answer_first": []}
            for _ in range(args.rounds):
                for key in row:
                    answer_first[0] = key == "answer_first"
                    s, costed = command(path)
                    row[key].append({"s": round(s, 3), "costed": costed})
            answer_first[0] = False
            out[name] = row
            print(json.dumps({name: row}), file=sys.stderr)
    planners._run = run
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
