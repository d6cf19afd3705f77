"""e4m3 inputs for flash_attn_func's FP8 forward (fa3_wgmma_sm90 on sm_90a; issue 36).

quantize(x, kv_heads) gives FA3's representation: the values as torch.float8_e4m3fn and one
float32 descale factor per (batch, kv head), amax / 448 (a query head shares its kv head's),
so that x ~ values * descale:

    from flashlab import flash_attn_func, fp8
    (q8, q_descale), (k8, k_descale), (v8, v_descale) = (fp8.quantize(x, kv_heads) for x in (q, k, v))
    out = flash_attn_func(q8, k8, v8, causal=True, q_descale=q_descale, k_descale=k_descale,
                          v_descale=v_descale)                       # bfloat16

Activations with outlier channels (a few channels much larger than the rest) lose most of
their accuracy to e4m3's 3-bit mantissa whatever the scale (docs/fp8-accuracy.md). Rotating
Q and K by the same random orthogonal matrix first (FA3's "incoherent processing") leaves
Q K^T unchanged and spreads an outlier over every channel:

    rotation = fp8.random_hadamard(head_dim, seed=0, device=q.device)
    (q8, q_descale), (k8, k_descale) = fp8.quantize(q @ rotation, kv_heads), fp8.quantize(k @ rotation, kv_heads)

(On 20x outliers in 4 of 128 channels, H100: RMSE 4.5x below a per-tensor cast.) Pure torch:
no kernel of flashlab's runs here.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # e4m3's largest finite value


def quantize(x: torch.Tensor, kv_heads: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """x (batch, seqlen, heads, head_dim), any float dtype -> (values e4m3, descale float32
    (batch, kv_heads), contiguous): descale = amax over each (batch, kv head)'s rows, query
    heads and columns / 448, values = x / descale rounded to e4m3 (never past +-448).
    kv_heads: k and v's head count (q's heads are grouped onto it); default x's heads."""
    if x.dim() != 4:
        raise ValueError(f"fp8.quantize: x must be (batch, seqlen, heads, head_dim); got shape {tuple(x.shape)}")
    batch, seqlen, heads, head_dim = x.shape
    kv_heads = heads if kv_heads is None else kv_heads
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"fp8.quantize: heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    group = heads // kv_heads
    amax = x.detach().abs().reshape(batch, seqlen, kv_heads, group, head_dim).amax(dim=(1, 3, 4)).float()
    descale = (amax.clamp_min(torch.finfo(torch.float32).tiny) / E4M3_MAX).contiguous()
    scaled = x.float() / descale.repeat_interleave(group, dim=1)[:, None, :, None]
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), descale


def dequantize(values: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What quantize's (values, descale) stand for, in `dtype`."""
    group = values.shape[2] // descale.shape[1]
    return values.to(dtype) * descale.to(dtype).repeat_interleave(group, dim=1)[:, None, :, None]


def random_hadamard(head_dim: int, seed: int = 0, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An orthogonal (head_dim, head_dim) matrix: Sylvester's Hadamard matrix with random column
    signs (from `seed`), scaled by 1 / sqrt(head_dim). (q R)(k R)^T = q k^T; head_dim a power of two."""
    if head_dim <= 0 or head_dim & (head_dim - 1):
        raise ValueError(f"fp8.random_hadamard: head_dim must be a power of two; got {head_dim}")
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < head_dim:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)], 0)
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (head_dim,), generator=generator).to(torch.float64) * 2 - 1
    return (matrix * signs / math.sqrt(head_dim)).to(device=device, dtype=dtype)
