"""``pipeline.stage_span``, the least span of a stage the planners' bounds use, against the
schedule recurrence the estimator runs: never above it on random pipelines of either schedule
(beyond ``STEADY_AFTER`` x stages too, where the estimator extrapolates), and exact for a
pipeline of equal stages under 1F1B with more microbatches than stages."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.estimate.pipeline import schedule_times, stage_span, stage_spans


def _ends(f: np.ndarray, b: np.ndarray, m: int, gpipe: bool) -> np.ndarray:
    S = len(f)
    _, ends = schedule_times(f[None, :, None], b[None, :, None], np.array([[float(m)]]),
                             np.array([gpipe]), np.array([S]))
    return ends[0, :, 0]


@settings(max_examples=300, deadline=None)
@given(S=st.integers(1, 9), m=st.integers(1, 60), gpipe=st.booleans(), seed=st.integers(0, 10**6),
       ratio=st.sampled_from([None, 2.0]))
def test_no_stage_ends_before_its_span(S, m, gpipe, seed, ratio):
    rng = np.random.default_rng(seed)
    f = rng.uniform(0.05, 2.0, S)
    b = f * ratio if ratio else rng.uniform(0.05, 5.0, S)
    ends = _ends(f, b, m, gpipe)
    t = f + b
    for s in range(S):
        # the stage starts after the forwards before it, and spans at least stage_span
        least = f[:s].sum() + stage_span(m, min(S - 1 - s, m), f[s], b[s], t[s + 1:].sum(),
                                         not gpipe)
        assert ends[s] >= least * (1 - 1e-12), (s, ends[s], least)


@pytest.mark.parametrize("S,m", [(1, 5), (3, 4), (4, 5), (6, 24), (8, 100)])
def test_equal_stages_under_1f1b_are_exact(S, m):
    f, b = np.full(S, 1.0), np.full(S, 2.0)
    makespan = _ends(f, b, m, False)[0]
    assert makespan == pytest.approx((m + S - 1) * 3.0)
    assert stage_span(m, min(S - 1, m), 1.0, 2.0, 3.0 * (S - 1), True) == pytest.approx(makespan)


def test_the_table_is_the_stage_span_of_every_stage_and_count():
    m = np.array([3.0, 10.0])
    w = np.minimum(np.array([[2.0], [1.0], [0.0]]), m[None, :])
    f, b, later = np.array([1.0, 0.5, 2.0]), np.array([2.0, 1.0, 3.0]), np.array([4.5, 5.0, 0.0])
    got = stage_spans(m, w, f, b, later, True)
    for s in range(3):
        for i in range(2):
            assert got[s, i] == stage_span(m[i], w[s, i], f[s], b[s], later[s], True)
