"""Kernel timing (tile and wave quantisation, fused attention, memory-bound work) and the
collective formulas every estimate uses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shoal import catalog
from shoal.catalog.stacks import stacks
from shoal.profiles import collectives as coll
from shoal.profiles.analytic import AnalyticProfile, device, peak_flops, uses_flash
from shoal.profiles.kernels import Device, flash_attention_s, gemm_s, memory_bound_s


def a100(**kw) -> Device:
    base = dict(peak_flops=312e12, mem_bw_Bps=2.0e12, sm_count=108, gemm=0.8,
                attention_fwd=0.6, attention_bwd=0.3, memory=0.8, launch_s=0.0)
    return Device(**(base | kw))


def test_a_gemm_one_tile_past_a_full_wave_pays_a_whole_wave():
    """108 SMs: 108 tiles of 256 x 128 fill one wave; one more tile row starts a second
    wave, so the time per FLOP jumps (wave quantisation)."""
    dev = a100()
    full = gemm_s(dev, 256 * 12, 128 * 9, 4096)  # 108 tiles
    over = gemm_s(dev, 256 * 12 + 1, 128 * 9, 4096)  # a 13th tile row
    assert over > 1.3 * full
    # a large GEMM runs close to the stack's share of the peak
    big = gemm_s(dev, 16384, 16384, 16384)
    assert 2 * 16384**3 / big / 312e12 == pytest.approx(0.8, rel=0.05)


def test_k_is_padded_to_the_tile_depth():
    dev = a100()
    assert gemm_s(dev, 8192, 8192, 1000) == pytest.approx(gemm_s(dev, 8192, 8192, 1024),
                                                          rel=1e-9)
    assert gemm_s(dev, 8192, 8192, 1024) < gemm_s(dev, 8192, 8192, 1025)


def test_a_thin_gemm_is_memory_bound_and_a_cpu_has_no_waves():
    dev = a100()
    thin = gemm_s(dev, 1, 8192, 8192)  # a matrix-vector product
    assert thin == pytest.approx((8192 * 8192 + 8192 + 8192) * 2 / (2e12 * 0.8), rel=1e-9)
    cpu = a100(sm_count=None, f_half_flops=1e6)
    f = 2.0 * 64**3
    assert gemm_s(cpu, 64, 64, 64) == pytest.approx(
        max(f / (312e12 * 0.8 * f / (f + 1e6)), (3 * 64 * 64) * 2 / (2e12 * 0.8)), rel=1e-9)


def test_flash_backward_does_two_and_a_half_forwards_and_elementwise_moves_bytes():
    dev = a100(launch_s=1e-6)
    assert flash_attention_s(dev, 1e12, False) == pytest.approx(1e12 / (312e12 * 0.6) + 1e-6)
    assert flash_attention_s(dev, 1e12, True) == pytest.approx(2.5e12 / (312e12 * 0.3) + 1e-6)
    assert memory_bound_s(dev, 1.6e9, 3) == pytest.approx(1.6e9 / 1.6e12 + 3e-6)


def test_precision_picks_the_peak_the_multiplies_run_at():
    h100 = catalog.gpus().get("H100-80GB")
    v100 = catalog.gpus().get("V100-16GB")
    assert peak_flops(h100, "mixed-fp8") == h100.flops_fp8 > peak_flops(h100, "mixed-bf16")
    assert peak_flops(h100, "tf32") == h100.flops_tf32
    assert peak_flops(v100, "mixed-fp8") == v100.flops_16  # no fp8: 16-bit multiplies
    assert peak_flops(v100, "tf32") == v100.flops_32  # no tf32 tensor cores
    assert peak_flops(h100, "fp32") == h100.flops_32


def test_flash_attention_where_the_stack_and_the_gpu_have_it():
    gpus = catalog.gpus()
    mega, eager = stacks()["megatron"], stacks()["hf-eager"]
    assert uses_flash(gpus.get("A100-40GB"), mega) and uses_flash(gpus.get("H100-80GB"), mega)
    assert not uses_flash(gpus.get("V100-16GB"), mega)  # Volta: no flash kernels
    assert not uses_flash(gpus.get("A100-40GB"), eager)
    assert not uses_flash(gpus.get("A100-40GB"), mega, attention="eager")


def test_eager_attention_grows_with_the_square_of_the_sequence_flash_keeps_no_scores():
    """Materialised scores cost memory traffic quadratic in the sequence; flash attention
    does the FLOPs only: at a long sequence eager is much slower."""
    m = catalog.models().get("LLaMA-2-7B")
    gpus = {"A100-80GB": catalog.gpus().get("A100-80GB")}
    fl = AnalyticProfile(m, 8192, gpus, stacks()["megatron"])
    ea = AnalyticProfile(m, 8192, gpus, stacks()["megatron"], attention="eager")
    assert ea.layer_times("A100-80GB", 1, 1)[1, 0] > 1.2 * fl.layer_times("A100-80GB", 1, 1)[1, 0]


def test_tensor_parallelism_splits_a_block_and_adds_its_all_reduces():
    m = catalog.models().get("LLaMA-2-7B")
    g = catalog.gpus().get("A100-80GB")
    prof = AnalyticProfile(m, 2048, {"A100-80GB": g}, stacks()["megatron"])
    t1, t2 = prof.layer_times("A100-80GB", 1, 4)[1, 0], prof.layer_times("A100-80GB", 2, 4)[1, 0]
    ar = coll.ring_allreduce_s(4 * 2048 * 4096 * 2.0, 2, g.intra_node_bw_Bps * 0.75)
    # half the GEMMs and attention, the norms whole, and two all-reduces of the hidden state
    assert t1 / 2 + 2 * ar < t2 < t1
    # every kind of GPU gets times: Hopper's kernels differ from the default
    assert device(catalog.gpus().get("H100-80GB"), stacks()["fsdp"], "mixed-bf16").gemm != \
        device(g, stacks()["fsdp"], "mixed-bf16").gemm


# ---- collectives --------------------------------------------------------------------------


def test_ring_and_tree_all_reduce_and_their_halves():
    B, bw, lat = 1e9, 1e10, 1e-5
    assert coll.ring_allreduce_s(B, 8, bw, lat) == pytest.approx(2 * 7 / 8 * 0.1 + 14 * lat)
    assert coll.tree_allreduce_s(B, 8, bw, lat) == pytest.approx(2 * 0.1 + 2 * 3 * lat)
    assert coll.ring_allreduce_s(B, 1, bw, lat) == 0.0 == coll.tree_allreduce_s(B, 1, bw, lat)
    assert coll.reduce_scatter_s(B, 8, bw, lat) == pytest.approx(
        coll.ring_allreduce_s(B, 8, bw, lat) / 2)
    assert coll.all_gather_s(B, 8, bw, lat) == coll.reduce_scatter_s(B, 8, bw, lat)
    assert coll.broadcast_s(B, 4, bw, lat) == pytest.approx(0.1 + 3 * lat)
    assert coll.p2p_s(B, bw, lat) == pytest.approx(0.1 + lat)


def test_nccl_picks_the_tree_for_small_buffers_on_many_members():
    small, big, n = 1e4, 1e10, 1024
    ring_s, tree_s = coll.ring_allreduce_s(small, n, 1e10, 1e-5), coll.tree_allreduce_s(
        small, n, 1e10, 1e-5)
    assert tree_s < ring_s and coll.allreduce_s(small, n, 1e10, 1e-5) == tree_s
    assert coll.allreduce_s(big, 8, 1e10, 1e-5) == coll.ring_allreduce_s(big, 8, 1e10, 1e-5)


def test_a_member_shares_its_nodes_network_across_nodes_only():
    assert coll.member_bandwidth(300e9, 200e9, 8, 1) == 300e9  # one node: its NVLink
    assert coll.member_bandwidth(300e9, 200e9, 8, 4) == 25e9  # 8 members share 200 GB/s
    assert coll.member_bandwidth(300e9, 3200e9, 8, 4) == 300e9  # never faster than NVLink
    got = coll.member_bandwidth(np.array([300e9, 300e9]), 200e9, np.array([1, 8]), 2)
    assert np.allclose(got, [200e9, 25e9]) and not math.isnan(got.sum())
