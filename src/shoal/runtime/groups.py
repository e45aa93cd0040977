"""The process groups of a plan: one per replica's TP ranks, and, per stage, the groups its
replicas sum gradients in.

Replicas of one stage may have different TP degrees. Their parameters meet in G pieces, G the
least common multiple of the degrees: piece q of a TP-split tensor is its q-th of G equal parts
along the split dimension, which a replica of degree t holds on its TP rank q // (G / t). The
ranks holding piece q, one per replica, form its sync group (consecutive pieces with the same
ranks share one); a replicated tensor (a norm, an output bias) is the same on every TP rank of a
replica and goes through every sync group. With equal degrees, the sync groups are the usual
data-parallel groups, one per TP rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.distributed as dist

from shoal.runtime.layout import Layout
from shoal.runtime.model import TPGroup


@dataclass
class SyncGroup:
    """A sync group this rank is in: pieces [lo, hi) of G, its members (global ranks, one per
    replica), this rank's index among them, and the process group (None: one member)."""

    lo: int
    hi: int
    members: tuple[int, ...]
    me: int
    group: object = None

    @property
    def size(self) -> int:
        return len(self.members)


def sync_layout(lay: Layout, stage: int) -> tuple[int, list[tuple[int, int, tuple[int, ...]]]]:
    """(G, [(lo, hi, members)]) of a stage's sync groups."""
    tps = lay.tp[stage]
    G = math.lcm(*tps)
    out: list[tuple[int, int, tuple[int, ...]]] = []
    for q in range(G):
        members = tuple(r0 + q // (G // t) for r0, t in zip(lay.first_rank[stage], tps, strict=True))
        if out and out[-1][2] == members:
            out[-1] = (out[-1][0], q + 1, members)
        else:
            out.append((q, q + 1, members))
    return G, out


@dataclass
class Groups:
    tp: TPGroup
    G: int  # pieces a stage's TP-split tensors are summed in
    sync: list[SyncGroup]  # the sync groups this rank is in, by piece

    @property
    def replicated(self) -> bool:
        """Whether the stage has other replicas (a sync group of more than this rank)."""
        return any(g.size > 1 for g in self.sync)


def make_groups(lay: Layout, rank: int) -> Groups:
    """This rank's groups. Collective: every rank creates every group, in the same order."""
    role = lay.roles[rank]
    tp_group = None
    for s, reps in enumerate(lay.first_rank):
        for j, r0 in enumerate(reps):
            n = lay.tp[s][j]
            if n > 1:
                g = dist.new_group(list(range(r0, r0 + n)))
                if (s, j) == (role.stage, role.replica):
                    tp_group = g
    mine: list[SyncGroup] = []
    G = 1
    for s in range(lay.n_stages):
        g_s, groups = sync_layout(lay, s)
        if s == role.stage:
            G = g_s
        for lo, hi, members in groups:
            pg = dist.new_group(list(members)) if len(members) > 1 else None
            if rank in members:
                mine.append(SyncGroup(lo, hi, members, members.index(rank), pg))
    tp = TPGroup(lay.tp[role.stage][role.replica], role.tp_rank, tp_group)
    return Groups(tp, G, mine)
