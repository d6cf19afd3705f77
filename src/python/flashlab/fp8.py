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


def _sequence_lengths(cu_seqlens: torch.Tensor, rows: int) -> torch.Tensor:
    """The lengths of a packed batch's sequences (int64, cu_seqlens' device); they must cover `rows`."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    if int(lengths.sum()) != rows:  # reads cu_seqlens on the host: quantizing is not a hot path
        raise ValueError(f"fp8: cu_seqlens covers {int(lengths.sum())} rows; the packed tensor has {rows}")
    return lengths


def quantize(x: torch.Tensor, kv_heads: Optional[int] = None,
             cu_seqlens: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """x (batch, seqlen, heads, head_dim), any float dtype -> (values e4m3, descale float32
    (batch, kv_heads), contiguous): descale = amax over each (batch, kv head)'s rows, query
    heads and columns / 448, values = x / descale rounded to e4m3 (never past +-448).
    kv_heads: k and v's head count (q's heads are grouped onto it); default x's heads.
    Packed tokens for flash_attn_varlen_func: x (total, heads, head_dim) with cu_seqlens
    (the int32 prefix sums, batch + 1): a descale row a sequence, 1 for an empty one."""
    packed = cu_seqlens is not None
    if x.dim() != (3 if packed else 4):
        shape = "(total, heads, head_dim) with cu_seqlens" if packed else "(batch, seqlen, heads, head_dim)"
        raise ValueError(f"fp8.quantize: x must be {shape}; got shape {tuple(x.shape)}")
    heads, head_dim = x.shape[-2], x.shape[-1]
    kv_heads = heads if kv_heads is None else kv_heads
    if kv_heads <= 0 or heads % kv_heads:
        raise ValueError(f"fp8.quantize: heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    group = heads // kv_heads
    magnitudes = x.detach().abs().reshape(*x.shape[:-2], kv_heads, group * head_dim).amax(dim=-1).float()
    if packed:  # (total, kv_heads) -> the largest of each sequence's rows
        lengths = _sequence_lengths(cu_seqlens, x.shape[0])
        sequence = torch.repeat_interleave(torch.arange(lengths.numel(), device=x.device), lengths.to(x.device),
                                           output_size=x.shape[0])
        amax = torch.zeros(lengths.numel(), kv_heads, device=x.device, dtype=torch.float32)
        amax.scatter_reduce_(0, sequence[:, None].expand(-1, kv_heads), magnitudes, "amax")
        amax = torch.where(lengths.to(x.device)[:, None] > 0, amax, torch.full_like(amax, E4M3_MAX))
    else:
        amax = magnitudes.amax(dim=1)
    descale = (amax.clamp_min(torch.finfo(torch.float32).tiny) / E4M3_MAX).contiguous()
    scaled = x.float() / _factors(descale, group, cu_seqlens, x.shape[0])
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), descale


def _factors(descale: torch.Tensor, group: int, cu_seqlens: Optional[torch.Tensor], rows: int) -> torch.Tensor:
    """descale (batch, kv_heads) shaped to multiply the values: (batch, 1, heads, 1), or packed (total, heads, 1)."""
    per_head = descale.repeat_interleave(group, dim=1)
    if cu_seqlens is None:
        return per_head[:, None, :, None]
    lengths = _sequence_lengths(cu_seqlens, rows).to(per_head.device)
    return per_head.repeat_interleave(lengths, dim=0, output_size=rows)[:, :, None]


def dequantize(values: torch.Tensor, descale: torch.Tensor, dtype: torch.dtype = torch.float32,
               cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """What quantize's (values, descale) stand for, in `dtype` (packed values: with their cu_seqlens)."""
    group = values.shape[-2] // descale.shape[1]
    return values.to(dtype) * _factors(descale.to(dtype), group, cu_seqlens, values.shape[0])


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
