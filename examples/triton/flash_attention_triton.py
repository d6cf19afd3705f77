"""A FlashAttention-2-style forward pass written in Triton, for flashlab.

This is the Triton counterpart of the CUDA forward kernels in src/kernels/: the
same inputs (flash-attn's layout), the same mask rule, the same outputs (the
attention output and the log-sum-exp of every query row), in about a hundred
lines of Triton instead of CUDA C++. It is an example, not one of the
registered kernels: nothing in the C++ library or the Python package calls it.

Algorithm
---------
For one query row i, out_i = sum_j softmax_j(scale * q_i . k_j) v_j over the keys
j the row may see. The kernel never forms the whole score matrix: it walks the
keys in tiles and keeps, per row, an online softmax state:

* m: the running maximum of the scores seen so far (the reference point that
  keeps exp() from overflowing);
* l: the running sum of exp(score - m);
* acc: the running sum of exp(score - m) * v_j, a head_dim-wide vector.

When a new key tile raises the maximum from m to m', the old l and acc were
weighted relative to m, so both are multiplied by alpha = exp(m - m') before the
tile's own terms (taken relative to m') are added. After the last tile,
out = acc / l and lse = m + log(l). The exponentials are taken in base 2
(exp2 is the cheap instruction on GPUs): the scores are multiplied by
softmax_scale * log2(e) once, so m and l live in base 2 and lse is converted
back to natural-log units at the end.

Tiling
------
One program handles one tile of ``block_m`` query rows of one (batch, head)
pair: the grid is (ceil(seqlen_q / block_m), batch * heads). The program loads
its Q tile once, then loops over K/V tiles of ``block_n`` keys: S = Q K^T
(tl.dot, fp32 accumulation), the mask, the online-softmax update, and
acc += P V with P cast to the input's 16-bit type (tl.dot again). Under
``causal`` a program stops after the last key tile its bottom row can see, so
a query tile does roughly half the work of a non-causal one on a square problem.
Every tile gets the mask (the sequence bounds on both sides and, if causal, the
diagonal); a production kernel would skip it on the interior tiles.

Mask and special rows
---------------------
Causal masking is bottom-right aligned, as flash-attn defines it: query row i
sees key j iff j <= i + seqlen_k - seqlen_q. With seqlen_q > seqlen_k the first
seqlen_q - seqlen_k rows see no key at all: such a row gets out = 0 and
lse = -inf (never NaN). Any seqlen_q, seqlen_k >= 1 works (1, 7, 113, 1023, ...):
loads and stores are masked on the query and key bounds.

Entries
-------
``attention(q, k, v, causal=False, softmax_scale=None, block_m=64, block_n=64, tile_trace=None)``
    returns ``(out, lse)``. q is (batch, seqlen_q, heads, head_dim); k and v are
    (batch, seqlen_k, kv_heads, head_dim) with heads % kv_heads == 0 (GQA/MQA:
    query head h reads K/V head h // (heads // kv_heads)); any strides whose
    last dimension is contiguous. out has q's shape and dtype (freshly allocated,
    not zero-filled: the kernel writes every element), lse is float32
    (batch, heads, seqlen_q) in natural-log units. softmax_scale defaults to
    1 / sqrt(head_dim).

``tile_trace=(row_max, row_sum)``
    float32 (batch, heads, seqlen_q, key tiles) buffers: the kernel writes each
    row's running max m (natural-log units) and running sum l after every key
    tile it visits, which flashlab.testing.trace_tiles compares with float64
    online softmax to name the first (key tile, row, statistic) that departs.

``attention_planted_bug(...)``, same signature
    runs the very same kernel with its ``PLANTED_BUG`` constexpr set. The bug is
    in the running-max update of key tile 1 (keys block_n .. 2*block_n - 1) only:
    the running max is overwritten with the new maximum *before* the rescale
    factor is taken from it, so alpha = exp2(m' - m') = 1 and the tile-0 terms
    already in l and acc are not rescaled. A row whose maximum moves in tile 1
    (the maximum of its keys 0 .. 2*block_n - 1 lies in tile 1, which includes
    every row whose overall maximum score lies in tile 1) comes out wrong yet
    finite; rows whose maximum stays in tile 0, and every problem with
    seqlen_k <= block_n, are unaffected. The entry exists for a debugging demo:
    it shows the harness (a comparison against a reference that reports where
    the output departs) locating the bug by key tile. (Keeping the old maximum
    instead would *not* be a visible bug: online softmax is exact for any
    reference point as long as acc and l are rescaled consistently; only an
    inconsistency between them, or between tiles, changes the result.)

Limits
------
* head_dim is a compile-time constant: any power of two from 16 to 256 (64 and
  128 are the usual ones); block_m and block_n are powers of two >= 16.
* dtypes: float16 and bfloat16; float32 also works (its dots run in IEEE fp32,
  which is what the CPU-interpreter test uses). q, k and v share one dtype and
  one device.
* Forward only: no backward, no dropout, no sliding window, no ALiBi, no
  variable-length (packed) batches, no KV cache.
* Not tuned: fixed tile sizes and warp counts, no autotuning, no persistent
  grid, no TMA or warp specialization.

Running it
----------
Triton ships with torch's CUDA wheels on Linux (``pip install torch`` brings
``triton`` along as a dependency); the CPU-only torch wheels do not include it,
so ``pip install triton`` is needed there. Setting the environment variable
``TRITON_INTERPRET=1`` *before* importing triton runs the kernels on the CPU in
Triton's interpreter (with numpy; slowly, one program at a time) on CPU
tensors: examples/triton/test_flash_attention_triton.py does that when no CUDA
device is present.
"""

import math

import torch
import triton
import triton.language as tl

__all__ = ["attention", "attention_planted_bug"]

# log2(e) and ln(2): the scores are scaled into base 2 once, and the
# log-sum-exp is converted back to natural-log units at the end.
_LOG2_E = 1.4426950408889634
_LN_2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _flash_attention_forward_kernel(
    Q, K, V, Out, Lse, TraceMax, TraceSum,
    stride_q_batch, stride_q_row, stride_q_head,
    stride_k_batch, stride_k_row, stride_k_head,
    stride_v_batch, stride_v_row, stride_v_head,
    stride_o_batch, stride_o_row, stride_o_head,
    seqlen_q, seqlen_k, heads, heads_per_kv_head, num_key_tiles,
    scale_log2,  # softmax_scale * log2(e)
    CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    PLANTED_BUG: tl.constexpr,
    TRACE: tl.constexpr,
):
    query_tile = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    kv_head = head // heads_per_kv_head

    # 64-bit base offsets: batch * stride can pass 2^31 on large inputs.
    q_base = Q + batch.to(tl.int64) * stride_q_batch + head.to(tl.int64) * stride_q_head
    k_base = K + batch.to(tl.int64) * stride_k_batch + kv_head.to(tl.int64) * stride_k_head
    v_base = V + batch.to(tl.int64) * stride_v_batch + kv_head.to(tl.int64) * stride_v_head
    o_base = Out + batch.to(tl.int64) * stride_o_batch + head.to(tl.int64) * stride_o_head

    rows = query_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this program
    cols = tl.arange(0, HEAD_DIM)
    key_offsets = tl.arange(0, BLOCK_N)
    row_in_bounds = rows < seqlen_q

    # The Q tile stays in registers for the whole key loop; rows past seqlen_q
    # read zeros and are never stored.
    q = tl.load(q_base + rows[:, None] * stride_q_row + cols[None, :],
                mask=row_in_bounds[:, None], other=0.0)

    # Online-softmax state, in base 2.
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # Bottom-right causal alignment: row i sees key j iff j <= i + diagonal.
    diagonal = seqlen_k - seqlen_q
    if CAUSAL:
        # The bottom row of the tile sees the most keys: up to and including
        # (query_tile + 1) * BLOCK_M - 1 + diagonal. Tiles past that are all
        # masked for every row here, so the loop ends before them; when even
        # the bottom row sees nothing the loop does not run at all.
        key_end = tl.minimum((query_tile + 1) * BLOCK_M + diagonal, seqlen_k)
        key_end = tl.maximum(key_end, 0)
    else:
        key_end = seqlen_k

    for key_start in range(0, key_end, BLOCK_N):
        keys = key_start + key_offsets
        key_in_bounds = keys < seqlen_k
        # K^T tile (HEAD_DIM x BLOCK_N) and V tile (BLOCK_N x HEAD_DIM).
        k_t = tl.load(k_base + keys[None, :] * stride_k_row + cols[:, None],
                      mask=key_in_bounds[None, :], other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_v_row + cols[None, :],
                    mask=key_in_bounds[:, None], other=0.0)

        s = tl.dot(q, k_t, input_precision=DOT_PRECISION) * scale_log2
        visible = key_in_bounds[None, :]
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + diagonal)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no visible key yet keeps m = -inf; exponentiate
        # against 0 instead so that exp2(-inf - (-inf)) = NaN never happens
        # (its p is then exp2(-inf) = 0 and its l and acc stay 0).
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)

        m_prev = m_i
        if PLANTED_BUG:
            # PLANTED BUG (attention_planted_bug only): in key tile 1 the running
            # max is overwritten before the rescale factor is read from it, so
            # alpha becomes exp2(m_new - m_new) = 1 and the tile-0 terms in l
            # and acc keep their old, too large, weight.
            m_prev = tl.where(key_start == BLOCK_N, m_new, m_i)
        alpha = tl.exp2(m_prev - m_ref)

        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
        if TRACE:
            # The state after this key tile, for flashlab.testing.trace_tiles: m in
            # natural-log units of the scaled scores, l as it is (a sum of exp(s - m)).
            trace_at = (batch_head.to(tl.int64) * seqlen_q + rows) * num_key_tiles + key_start // BLOCK_N
            tl.store(TraceMax + trace_at, m_i * _LN_2, mask=row_in_bounds)
            tl.store(TraceSum + trace_at, l_i, mask=row_in_bounds)

    # Rows that saw no key (l = 0): out 0 and lse -inf.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * _LN_2, float("-inf"))

    tl.store(o_base + rows[:, None] * stride_o_row + cols[None, :],
             out.to(Out.dtype.element_ty), mask=row_in_bounds[:, None])
    tl.store(Lse + batch_head.to(tl.int64) * seqlen_q + rows, lse, mask=row_in_bounds)


def _is_power_of_two(n):
    return n > 0 and (n & (n - 1)) == 0


def _forward(q, k, v, causal, softmax_scale, block_m, block_n, planted_bug, tile_trace=None):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4-D: (batch, seqlen, heads, head_dim)")
    batch, seqlen_q, heads, head_dim = q.shape
    batch_k, seqlen_k, kv_heads, head_dim_k = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    if batch_k != batch or head_dim_k != head_dim:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on batch or head_dim")
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"unsupported dtype {q.dtype}: float16, bfloat16 or float32")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError("q, k and v must share one dtype")
    if k.device != q.device or v.device != q.device:
        raise ValueError("q, k and v must be on one device")
    if not (_is_power_of_two(head_dim) and 16 <= head_dim <= 256):
        raise ValueError(f"head_dim {head_dim} must be a power of two in [16, 256]")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if not (_is_power_of_two(block) and block >= 16):
            raise ValueError(f"{name} {block} must be a power of two >= 16")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)

    # Not zero-filled: the kernel writes every element of both.
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse

    num_key_tiles = triton.cdiv(seqlen_k, block_n)
    if tile_trace is not None:
        trace_max, trace_sum = tile_trace
        expected = (batch, heads, seqlen_q, num_key_tiles)
        for t in (trace_max, trace_sum):
            if tuple(t.shape) != expected or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"tile_trace buffers must be contiguous float32 {expected}; got "
                                 f"{tuple(t.shape)} {t.dtype}")
    else:
        trace_max = trace_sum = lse  # not read: TRACE is off

    grid = (triton.cdiv(seqlen_q, block_m), batch * heads)
    _flash_attention_forward_kernel[grid](
        q, k, v, out, lse, trace_max, trace_sum,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        seqlen_q, seqlen_k, heads, heads // kv_heads, num_key_tiles,
        float(softmax_scale) * _LOG2_E,
        CAUSAL=bool(causal),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        PLANTED_BUG=bool(planted_bug),
        TRACE=tile_trace is not None,
        num_warps=4 if head_dim <= 64 else 8,
        num_stages=2,
    )
    return out, lse


def attention(q, k, v, causal=False, softmax_scale=None, block_m=64, block_n=64, tile_trace=None):
    """FlashAttention-2-style forward: returns (out, lse).

    q: (batch, seqlen_q, heads, head_dim); k, v: (batch, seqlen_k, kv_heads,
    head_dim), heads % kv_heads == 0. out is like q; lse is float32
    (batch, heads, seqlen_q), natural log. tile_trace: (row_max, row_sum)
    float32 (batch, heads, seqlen_q, key tiles) that receive every row's
    online-softmax state after each key tile (flashlab.testing.trace_tiles).
    See the module docstring.
    """
    return _forward(q, k, v, causal, softmax_scale, block_m, block_n, planted_bug=False, tile_trace=tile_trace)


def attention_planted_bug(q, k, v, causal=False, softmax_scale=None, block_m=64, block_n=64, tile_trace=None):
    """attention() with the planted running-max bug in key tile 1 (debugging demo).

    Same signature and outputs as attention(); rows whose running maximum moves
    in key tile 1 (keys block_n .. 2*block_n - 1) come out wrong. See the
    module docstring.
    """
    return _forward(q, k, v, causal, softmax_scale, block_m, block_n, planted_bug=True, tile_trace=tile_trace)
