"""What the serving commands read alike: the serving file as a cluster, a placement given or
found, a ``--trace`` file, the ``--dtype`` option; and a status line unless ``--json``."""

from __future__ import annotations

import contextlib
from pathlib import Path

from shoal.cli.common import _progress
from shoal.errors import SpecError

DTYPES = ("float32", "float64")  # what serve run's workers and serve profile compute in


def load_cluster(serving: Path):
    """The serving file's nodes and links, as the placers and the simulator take them."""
    from shoal.serving.cluster import build_cluster
    from shoal.specs.serving import load_serving

    return build_cluster(load_serving(serving), file=str(serving))


def given_placement(cluster, placement: Path | None):
    """A placement file (shoal JSON or Helix .ini), or auto's when none is given."""
    from shoal.serving.flow import max_flow
    from shoal.serving.placement import load_placement
    from shoal.serving.placers import Placed, place

    if placement is None:
        return place(cluster, "auto", time_limit_s=10.0)
    if placement.suffix.lower() == ".ini":
        from shoal.io.helix import read_placement

        pl = read_placement(placement, cluster)
    else:
        pl = load_placement(placement, cluster)
    return Placed("given", pl, max_flow(cluster, pl), cluster.upper_bound(), 0.0)


def trace_workload(trace: Path, **others):
    """The requests of a ``--trace`` file; the options it replaces must not be given too."""
    from shoal.serving import workload as wl

    given = [f"--{k}" for k, v in others.items() if v is not None]
    if given:
        raise SpecError("a trace gives the arrivals and lengths itself", field="--trace",
                        value=" ".join(given), allowed="--trace alone, or "
                        + " / ".join(f"--{k}" for k in others))
    return wl.load_trace(trace)


def check_dtype(dtype: str) -> None:
    """A SpecError naming --dtype unless it is one the workers compute in."""
    if dtype not in DTYPES:
        raise SpecError("unknown dtype", field="--dtype", value=dtype, allowed=", ".join(DTYPES))


def status(text: str, as_json: bool):
    """A status line on stderr while the block runs; none under ``--json``."""
    return contextlib.nullcontext() if as_json else _progress().status(text)
