"""Measured-profile smoothing, interpolation, and the transfer between models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shoal.errors import SpecError
from shoal.profiles.compute import ComputeProfile, load_profile, smooth_linear


def table(fwd, bwd, upd, n=3):
    return np.tile([fwd, bwd, upd], (n, 1)).astype(float)


def test_linear_input_is_kept():
    per = {m: table(0.001 + 0.002 * m, 0.002 + 0.004 * m, 0.01) for m in (1, 2, 4, 8)}
    out = smooth_linear(per)
    for m in per:
        np.testing.assert_allclose(out[m], per[m], rtol=1e-9)


def test_noisy_small_batch_is_pulled_onto_the_line():
    per = {m: table(0.001 + 0.002 * m, 0.002 + 0.004 * m, 0.01) for m in (2, 4, 8, 16)}
    per[1] = table(0.02, 0.006, 0.03)  # m=1 measured slower than m=2 (warm-up noise)
    out = smooth_linear(per)
    times = [out[m][0, 0] for m in sorted(out)]
    assert times == sorted(times)  # non-decreasing in microbatch size
    assert out[1][0, 0] < out[2][0, 0]
    assert np.all(out[1][:, 2] == 0.01)  # update: median over sizes


def test_interpolation_and_extrapolation_follow_the_line():
    prof = ComputeProfile(n_layers=3)
    prof.tables[("A100-40GB", 1)] = smooth_linear(
        {m: table(0.001 + 0.002 * m, 0.002 + 0.004 * m, 0.01) for m in (1, 2, 4)})
    for m in (3, 8):
        t = prof.layer_times("A100-40GB", 1, m)
        assert t[0, 0] == pytest.approx(0.001 + 0.002 * m)
        assert t[0, 1] == pytest.approx(0.002 + 0.004 * m)
    with pytest.raises(SpecError, match="no measurement"):
        prof.layer_times("V100-16GB", 1, 1)


def test_load_profile_checks_shape(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"schema": "shoal/profile@1", "n_layers": 3,
                             "gpus": {"A100-40": {"1": {"1": [[0.1, 0.2, 0.0]] * 2}}}}))
    with pytest.raises(SpecError) as e:
        load_profile(p, 3)
    assert e.value.field == "gpus.A100-40.1.1"
    p.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(SpecError, match="not a shoal profile"):
        load_profile(p, 3)
