"""Reference attention in plain PyTorch for the GPU suite, and flash-attn's
pass rule. No flashlab here: tests/python/test_reference_cpu.py checks it
against torch's scaled_dot_product_attention on the CPU.

Masks as flash-attn (and flashlab) define them, aligned bottom-right: query row i
of seqlen_q sees key j of seqlen_k when
    j >= i + seqlen_k - seqlen_q - window_left    (window_left >= 0)
    j <= i + seqlen_k - seqlen_q + window_right   (window_right >= 0; causal: 0)
A row that sees no key gives out 0 and lse -inf (with a sink: lse = the sink).

Score modifications, flash-attn's definitions, on the scaled scores s: softcap
-> softcap * tanh(s / softcap); ALiBi -> s - slope * |i + seqlen_k - seqlen_q - j|
(slopes (heads) or (batch, heads)); then the mask; sinks (heads): one more
logit per head in every row's softmax denominator, with no value row.
"""
import math

import torch


def visible(seqlen_q, seqlen_k, causal=False, window=(-1, -1), device=None):
    left, right = window
    if causal:
        right = 0
    rows = torch.arange(seqlen_q, device=device)[:, None]
    cols = torch.arange(seqlen_k, device=device)[None, :]
    diagonal = rows + seqlen_k - seqlen_q
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= cols >= diagonal - left
    if right >= 0:
        mask &= cols <= diagonal + right
    return mask


def reference_dtype(dtype):
    """The precise reference's dtype: float32 for 16-bit inputs, float64 for float32."""
    return torch.float64 if dtype == torch.float32 else torch.float32


def attention_ref(q, k, v, causal=False, window=(-1, -1), softmax_scale=None, softcap=0.0,
                  alibi_slopes=None, sinks=None):
    """q (batch, seqlen_q, heads, d), k/v (batch, seqlen_k, kv_heads, d), computed in
    q's dtype (call it on upcast copies for the precise reference; sinks too, which is
    differentiable like q, k, v). Returns out (batch, seqlen_q, heads, d) and lse
    (batch, heads, seqlen_q) float32."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    if heads != kv_heads:
        k = k.repeat_interleave(heads // kv_heads, dim=2)
        v = v.repeat_interleave(heads // kv_heads, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        rows = torch.arange(seqlen_q, device=q.device)[:, None]
        cols = torch.arange(seqlen_k, device=q.device)[None, :]
        distance = (rows + seqlen_k - seqlen_q - cols).abs().to(scores.dtype)
        slopes = alibi_slopes.to(scores.dtype).expand(batch, heads) if alibi_slopes.dim() == 2 \
            else alibi_slopes.to(scores.dtype)[None, :].expand(batch, heads)
        scores = scores - slopes[:, :, None, None] * distance
    mask = visible(seqlen_q, seqlen_k, causal, window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:  # one more column: the sink's logit, no value
        sink_column = sinks.to(scores.dtype)[None, :, None, None].expand(batch, heads, seqlen_q, 1)
        scores = torch.cat([scores, sink_column], dim=-1)
        mask = torch.cat([mask, torch.ones(seqlen_q, 1, dtype=torch.bool, device=q.device)], dim=-1)
    empty = ~mask.any(dim=-1, keepdim=True)  # rows that see no key (and no sink)
    lse = torch.logsumexp(scores.detach().float(), dim=-1)
    # Empty rows: softmax of finite stand-ins, then zeroed (no NaN in values or gradients).
    probs = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty | ~mask, 0.0)
    if sinks is not None:
        probs = probs[..., :seqlen_k]
    out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
    return out, lse


def varlen_attention_ref(q, k, v, cu_seqlens_q, cu_seqlens_k, **kwargs):
    """attention_ref one packed sequence at a time: q (total_q, heads, d), k/v (total_k,
    kv_heads, d). Returns out (total_q, heads, d) and lse (heads, total_q)."""
    outs, lses = [], []
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(bounds_q) - 1):
        sq, eq, sk, ek = bounds_q[b], bounds_q[b + 1], bounds_k[b], bounds_k[b + 1]
        out, lse = attention_ref(q[None, sq:eq], k[None, sk:ek], v[None, sk:ek], **kwargs)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def rounding_atol(reference, dtype):
    """flash-attn's atol: twice the rounding of (x + 0.3) - 0.3 in the input dtype, about
    one ulp at the reference's magnitude."""
    r = reference.detach().to(dtype)
    return 2 * ((r + 0.3 - 0.3) - r).abs().max().item()


def sink_gradient_stored_output_term(out, lse, dout, sinks, dtype):
    """Twice what storing the output in `dtype` moves dsinks' formula -sum over rows of
    exp(sink - LSE) * rowsum(dout * out) (the harness's stored_output_term): the kernels
    form D from the stored output, which torch's autograd never rounds. out, lse: the
    precise reference's, fixed-length (B, Sq, H, D) / (B, H, Sq) or packed (T, H, D) / (H, T)."""
    out, lse = out.detach(), lse.detach()
    shift = (dout.to(out.dtype) * (out.to(dtype).to(out.dtype) - out)).sum(-1).transpose(-1, -2)
    share = torch.exp(sinks.detach().to(lse.dtype).view(-1, 1) - lse)  # with sinks no LSE is -inf
    per_head = -(share * shift).movedim(-2, 0).reshape(share.shape[-2], -1).sum(1)
    return 2 * per_head.abs().max().item()


def assert_close_to_reference(name, actual, precise, same_precision, factor, dtype, extra_atol=0.0):
    """flash-attn's rule: |actual - precise| <= factor * |same_precision - precise| + atol
    (max over elements). factor 2 for out and lse, 3 for gradients. -inf must match.
    extra_atol: dsinks' stored-output term (sink_gradient_stored_output_term)."""
    actual, precise, same_precision = actual.detach(), precise.detach(), same_precision.detach()
    assert actual.shape == precise.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(precise.shape)}"
    assert not actual.isnan().any(), f"{name}: {int(actual.isnan().sum())} NaN"
    infinite = precise.isinf()
    if infinite.any():  # lse of rows that see no key
        assert torch.equal(actual[infinite].float(), precise[infinite].float()), f"{name}: -inf rows differ"
        keep = ~infinite
        actual, precise, same_precision = actual[keep], precise[keep], same_precision[keep]
    if actual.numel() == 0:
        return
    error = (actual.to(precise.dtype) - precise).abs().max().item()
    same_precision_error = (same_precision.to(precise.dtype) - precise).abs().max().item()
    atol = rounding_atol(precise, dtype) + extra_atol
    bound = factor * same_precision_error + atol
    assert error <= bound, (f"{name}: max error {error:.3e} > {factor} x {same_precision_error:.3e} "
                            f"(PyTorch in {dtype}) + atol {atol:.3e}")


# ---------------------------------------------------------------------------
# FP8 (e4m3) inputs (quantized by flashlab.fp8): the FP8 forward's own rounding of P.

E4M3 = torch.float8_e4m3fn
# The FP8 forward's P is exp(s - max) x 2^8 when rounded to e4m3 (the kernel's
# kFp8PExponent): the largest probability is 256, below e4m3's 448.
FP8_P_SCALE = 256.0


def fp8_emulated_attention(q, k, v, causal=False, window=(-1, -1), softmax_scale=None, products=None,
                           return_lse=False):
    """The FP8 forward's own arithmetic on dequantized q, k, v (float64): P = exp(s -
    max) x FP8_P_SCALE rounded to e4m3 for P V, the row sum from the unrounded P. Its
    error against attention_ref of the same inputs is what the format costs; the
    kernel is held to twice it. products: q k^T (batch, heads, seqlen_q, seqlen_k) as
    computed elsewhere (the GPU tests: on the FP8 tensor cores, whose accumulator keeps
    fewer bits than float32), else exact. Returns out (batch, seqlen_q, heads, d); with
    return_lse, (out, lse (batch, heads, seqlen_q)), the LSE of those scores (-inf for rows
    that see no key)."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    k = k.repeat_interleave(heads // kv_heads, dim=2)
    v = v.repeat_interleave(heads // kv_heads, dim=2)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    if products is None:
        products = torch.einsum("bqhd,bkhd->bhqk", q, k)
    scores = products.to(q.dtype) * scale
    mask = visible(seqlen_q, seqlen_k, causal, window, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(scores - row_max)
    row_sum = p.sum(dim=-1, keepdim=True)
    p_rounded = (p * FP8_P_SCALE).to(E4M3).to(p.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", p_rounded, v)
    denominator = (row_sum * FP8_P_SCALE).transpose(1, 2)  # (batch, seqlen_q, heads, 1)
    out = torch.where(denominator > 0, out / denominator.clamp_min(1e-300), torch.zeros_like(out))
    if return_lse:
        return out, (row_max + torch.log(row_sum)).squeeze(-1)
    return out
