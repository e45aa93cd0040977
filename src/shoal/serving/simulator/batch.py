"""What a node takes from its queue as one batch, and how long that batch takes."""

from __future__ import annotations

from shoal.serving.simulator.clock import Clock
from shoal.serving.simulator.events import Item

BATCHING = ("vllm", "live")


def form_batch(items: list[Item], done: list[int], prompt: list[int],
               caps: tuple[float, int, int], capped: bool, clock: Clock
               ) -> tuple[list[Item], list[Item], int, int, float]:
    """(taken, left queued, prompt tokens taken, decode steps taken, one layer's time) of a
    node whose queue holds ``items``, as vLLM 0.4 (Helix's engine) schedules it (``capped``):
    when prompts wait, a prefill step of whole prompts in arrival order while their number and
    tokens stay under the node's ``caps`` (prompts, prompt tokens, decode steps; at least one
    prompt), the decode steps waiting; otherwise one decode step of up to its cap. Not
    ``capped`` (``batching="live"``): the first queued request's step alone (a worker of
    ``shoal serve run`` runs what has arrived one request after the other and sends each on as
    it is done). ``done[r]``: tokens request r has generated (0: its step is the prompt)."""
    take: list[Item] = []
    rest: list[Item] = []
    if not capped:  # live: one request's step at a time, in arrival order, sent on when done
        items, rest = items[:1], items[1:]
    P = 0
    D = 0
    ctx = 0
    solo = 0.0  # live batching: the prompts' times, each on its own
    prefill_only = capped and any(done[it[0]] == 0 for it in items)
    max_p, max_pt, max_d = caps
    n_p = 0
    for it in items:
        r = it[0]
        if prefill_only and done[r] != 0:
            rest.append(it)
            continue
        if done[r] == 0:
            if (P + prompt[r] <= max_pt and n_p < max_p) or not take or not capped:
                P += prompt[r]
                n_p += 1
                if not capped:
                    solo += clock.layer_s(float(prompt[r]), 0, 0.0)
                take.append(it)
            else:
                rest.append(it)
        elif max_d > D or not capped:
            D += 1
            ctx += prompt[r] + done[r]
            take.append(it)
        else:
            rest.append(it)
    layer_s = (clock.layer_s(float(P), D, ctx / D if D else 0.0) if capped
               else solo + clock.layer_s(0.0, D, ctx / D if D else 0.0))
    return take, rest, P, D, layer_s
