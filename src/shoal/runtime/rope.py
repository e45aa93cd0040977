"""Rotary position embedding (Su et al. 2021, RoFormer §3.4) with the long-context scalings that
HuggingFace configs name: position interpolation (``linear``, Chen et al. 2023), dynamic NTK
(``dynamic``), Llama 3's wavelength-dependent scaling (``llama3``) and YaRN (``yarn``, Peng et al.
2023, §3.2-3.4).

Frequencies are computed in float32, as the checkpoints were trained with them; the angles and
their cosines in float32 too for float32 and lower-precision runs, in float64 for float64 runs.
"""

from __future__ import annotations

import math

import torch

from shoal.runtime.arch import Rope


def inv_freq(rope: Rope, seq_len: int) -> tuple[torch.Tensor, float]:
    """(the inverse frequency of each rotated pair of dimensions, the factor that scales cos
    and sin) for positions up to ``seq_len``."""
    dim = rope.rotary_dim
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    base = rope.theta
    orig = rope.original_max_positions
    if rope.scaling == "dynamic" and orig is not None and seq_len > orig:
        # NTK-aware: a larger base, so that the lowest frequency still spans the longer context
        base = base * ((rope.factor * seq_len / orig) - (rope.factor - 1)) ** (dim / (dim - 2))
    freq = 1.0 / (base ** exponent)
    if rope.scaling == "linear":
        return freq / rope.factor, 1.0
    if rope.scaling == "llama3":
        return _llama3(freq, rope), 1.0
    if rope.scaling == "yarn":
        return _yarn(freq, rope)
    return freq, 1.0


def _llama3(freq: torch.Tensor, rope: Rope) -> torch.Tensor:
    """Long wavelengths interpolated by the factor, short ones kept, a smooth ramp between."""
    orig = rope.original_max_positions or 8192
    wavelen = 2 * math.pi / freq
    low_wavelen = orig / rope.low_freq_factor
    high_wavelen = orig / rope.high_freq_factor
    smooth = (orig / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    mid = (1 - smooth) * freq / rope.factor + smooth * freq
    out = torch.where(wavelen > low_wavelen, freq / rope.factor, freq)
    between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(between, mid, out)


def _yarn(freq: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, float]:
    """YaRN's "NTK-by-parts": dimensions that turn more than ``beta_fast`` times over the
    original context keep their frequency, those turning fewer than ``beta_slow`` times are
    interpolated by the factor, a linear ramp between; cos and sin scaled by
    0.1 ln(factor) + 1 (the attention temperature) unless the config gives the factor."""
    dim = rope.rotary_dim
    orig = rope.original_max_positions or 2048
    factor = rope.factor

    def dim_of(turns: float) -> float:  # the dimension whose wavelength fits ``turns`` times
        return dim * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # share of the original frequency
    out = freq / factor * (1 - keep) + freq * keep
    scale = rope.attention_factor
    if scale is None:
        scale = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return out, scale


def cos_sin(rope: Rope, start: int, length: int, dtype: torch.dtype,
            device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions ``start .. start + length - 1`` (length x rotary_dim), each
    frequency's half repeated, as ``rotate`` expects."""
    freq, scale = inv_freq(rope, start + length)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    pos = torch.arange(start, start + length, dtype=work, device=device)
    ang = pos[:, None] * freq.to(device=device, dtype=work)[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return (ang.cos() * scale).to(dtype), (ang.sin() * scale).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` dimensions of each head of ``x`` (batch, heads, positions,
    head dim) by its position's angles; the rest pass through (partial rotary, GPT-NeoX)."""
    d = cos.shape[-1]
    rot, rest = x[..., :d], x[..., d:]
    half = d // 2
    turned = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos + turned * sin
    return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out
