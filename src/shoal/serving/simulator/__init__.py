"""Request-level discrete-event simulation of serving a placement (Helix §5, §6), on shoal's
event core (``shoal.estimate.events``).

Every request is routed once (``routing``) and then walks its chain for the prompt and for each
generated token. A node runs *dynamic batches*: when it is idle and work is queued, it takes
the queued prompts (a prefill step, the decode steps waiting) or else the queued decode steps
as one batch, whose time is its layer count x the per-layer prompt time of the batch's prompt
tokens or the per-layer decode time of its decode batch size. After a batch, the items
go on, grouped by their next node, over the link between the two: a link sends one message at a
time (FIFO) at its bandwidth, and the message arrives after the link's latency; a prompt sends
one activation per prompt token, a decode step one; a finished token goes back to the
coordinator as a token id, which then sends the request's next step to its first node.

Modes: ``offline`` keeps the cluster busy as Helix's offline runs do (``FEED_INITIAL`` requests
at the start, then one more after each prompt and each request completes while the expected KV
use of the fullest layer is at most ``FEED_HIGH_WATER``; or, given ``concurrency``, that many
requests in flight, one entering as one completes), ``online`` follows arrival times (requests
the KV cache cannot admit wait at the coordinator, first come first served). Metrics are taken
over the window after ``warmup_s``: decode throughput (generated tokens/s), prompt + decode
tokens/s, prompt latency (arrival or admission to first token) and decode latency per token
(first to last token over the output tokens after the first), node utilisation and KV use.

The modules: ``events`` (the four event kinds: a request arrives, a message reaches a node,
tokens reach the coordinator, a node's batch ends; their order at equal times), ``state`` (the
run's state, whose methods are the handlers; admission and routing), ``batch`` (what a node
takes as one batch), ``clock`` (how long it takes: layer times, waking, shared host cores),
``result`` (the metrics), ``simulation`` (``simulate``).
"""

from shoal.serving.simulator.batch import BATCHING
from shoal.serving.simulator.clock import woken
from shoal.serving.simulator.result import SimResult, _histogram, _stats
from shoal.serving.simulator.simulation import SimOptions, simulate
from shoal.serving.simulator.state import FEED_HIGH_WATER, FEED_INITIAL, KV_SETTINGS

__all__ = ["BATCHING", "FEED_HIGH_WATER", "FEED_INITIAL", "KV_SETTINGS", "SimOptions", "SimResult",
           "_histogram", "_stats", "simulate", "woken"]
