"""Collective communication as NCCL runs it: the one set of formulas every estimate, planner
and simulator uses.

Each function gives seconds for ``nbytes`` (the full buffer: an all-reduce's input, an
all-gather's output, a reduce-scatter's input) over ``n`` members, from the bandwidth one
member reaches on its slowest hop (``bw_Bps``, bytes/s) and the per-hop latency
(``latency_s``); all broadcast over NumPy arrays. The forms are the ones of NCCL's algorithms
(NCCL's performance documentation, "bus bandwidth"; Thakur, Rabenseifner and Gropp, "Optimization
of Collective Communication Operations in MPICH", 2005):

- ring all-reduce: a reduce-scatter then an all-gather round the ring, each member sending
  ``2 (n-1)/n`` of the buffer in ``2 (n-1)`` steps;
- tree all-reduce (NCCL's double binary tree, used between nodes): the buffer goes up and down
  pipelined trees, about twice the buffer per member, with ``2 log2 n`` steps of latency: slower
  than the ring for large buffers on few members, faster for small buffers on many;
- reduce-scatter and all-gather: half a ring all-reduce each;
- broadcast: a pipelined chain, the buffer once plus ``n-1`` latencies;
- point to point: the buffer once plus one latency.

Across nodes the ring is hierarchical: inside a node the hops are NVLink or PCIe, between nodes
they go through the nodes' NICs; every member's traffic crosses the slowest of them, so the
ring's bandwidth is the smaller of the intra-node bandwidth and what a member gets of its node's
network (``member_bandwidth``).
"""

from __future__ import annotations

import numpy as np


def ring_allreduce_s(nbytes, n, bw_Bps, latency_s=0.0):
    """Ring all-reduce of ``nbytes`` over ``n`` members (0 for one member)."""
    n = np.asarray(n, dtype=float)
    d = np.maximum(n, 1.0)
    return 2.0 * (d - 1.0) / d * np.asarray(nbytes, dtype=float) / bw_Bps \
        + 2.0 * (d - 1.0) * latency_s


def tree_allreduce_s(nbytes, n, bw_Bps, latency_s=0.0):
    """Double-binary-tree all-reduce of ``nbytes`` over ``n`` members (0 for one member)."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    steps = np.ceil(np.log2(n))
    return np.where(n > 1, 2.0 * np.asarray(nbytes, dtype=float) / bw_Bps
                    + 2.0 * steps * latency_s, 0.0)


def allreduce_s(nbytes, n, bw_Bps, latency_s=0.0):
    """All-reduce as NCCL chooses it: the faster of ring and tree for this size and count."""
    return np.minimum(ring_allreduce_s(nbytes, n, bw_Bps, latency_s),
                      tree_allreduce_s(nbytes, n, bw_Bps, latency_s))


def reduce_scatter_s(nbytes, n, bw_Bps, latency_s=0.0):
    """Ring reduce-scatter of an ``nbytes`` buffer over ``n`` members (each keeps 1/n)."""
    return 0.5 * ring_allreduce_s(nbytes, n, bw_Bps, latency_s)


def all_gather_s(nbytes, n, bw_Bps, latency_s=0.0):
    """Ring all-gather into an ``nbytes`` buffer over ``n`` members (each brings 1/n)."""
    return 0.5 * ring_allreduce_s(nbytes, n, bw_Bps, latency_s)


def broadcast_s(nbytes, n, bw_Bps, latency_s=0.0):
    """Pipelined broadcast of ``nbytes`` from one member to ``n - 1`` others."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    return np.where(n > 1, np.asarray(nbytes, dtype=float) / bw_Bps + (n - 1.0) * latency_s, 0.0)


def p2p_s(nbytes, bw_Bps, latency_s=0.0):
    """One message of ``nbytes`` from one member to another."""
    return np.asarray(nbytes, dtype=float) / bw_Bps + latency_s


def member_bandwidth(intra_Bps, node_network_Bps, members_per_node, nodes):
    """The bandwidth a member of a collective reaches on its slowest hop: inside one node its
    GPU-to-GPU link; across nodes also its share of its node's network, which the node's members
    of every concurrent collective (``members_per_node``) split."""
    share = np.asarray(node_network_Bps, dtype=float) / np.maximum(members_per_node, 1)
    return np.where(np.asarray(nodes) > 1, np.minimum(intra_Bps, share), intra_Bps)
