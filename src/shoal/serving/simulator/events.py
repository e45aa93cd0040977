"""The serving simulator's event kinds, on the event core (``shoal.estimate.events``).

An item is ``(request, hop)``: the request's step at the ``hop``-th node of its chain. A message
carries the items of one batch that go on to the same node (or back to the coordinator); it
arrives after its link has sent it (one message at a time) and the link's latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.estimate.events import Event

Item = tuple[int, int]  # (request, index of the node on its chain)


@dataclass(frozen=True, slots=True)
class RequestArrives(Event):
    """Online: ``request`` reaches the coordinator."""

    request: int


@dataclass(frozen=True, slots=True)
class MessageArrives(Event):
    """Activations (or, from the coordinator, token ids) of ``items`` reach ``node``."""

    node: int
    items: tuple[Item, ...]


@dataclass(frozen=True, slots=True)
class TokensArrive(Event):
    """The tokens of ``items``, each its request's next token, are back at the coordinator."""

    items: tuple[Item, ...]


@dataclass(frozen=True, slots=True)
class BatchEnds(Event):
    """``node`` finishes the batch of ``items``. With nodes sharing a host's cores, a batch's
    end moves whenever the sharing changes: only the end of the node's current ``version``
    counts."""

    node: int
    items: tuple[Item, ...]
    version: int = 0


# At equal times every kind is handled first scheduled, first handled (the simulator's own
# loop before the core kept one sequence over all kinds): a node that ends a batch the instant
# a message reaches it sees the two in the order their causes happened.
ORDER = ((BatchEnds, MessageArrives, TokensArrive, RequestArrives),)
