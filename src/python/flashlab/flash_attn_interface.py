"""flash-attn's Python API (flash_attn.flash_attn_interface) on flashlab's operators.

Same names, argument order and defaults as flash-attn 2, plus a keyword-only
`kernel="auto"` that picks a flashlab kernel (flashlab.kernels() lists them;
"auto" takes the first that runs the problem on this device, the backward the
forward kernel's own when it has one). Tensors are (batch, seqlen, heads,
head_dim), variable-length ones (total, heads, head_dim); GQA/MQA by passing k,
v with fewer heads.

Score modifications, flash-attn's definitions, in every call: softcap > 0
caps the scaled scores at softcap * tanh(s / softcap); alibi_slopes, float32
(heads) or (batch, heads), subtracts slope * |i + seqlen_k - seqlen_q - j|
(no gradient, as in flash-attn); and, keyword-only, sinks: a float32 (heads)
tensor of attention-sink logits (gpt-oss's; flash-attn's newest kernels call
it learnable_sink), one per head joining every row's softmax denominator (the
LSE counts it; a row that sees no key gives 0), differentiable: its gradient
is -sum over rows of exp(sink - lse) * rowsum(dout * out).

FP8 (FlashAttention-3's interface): q, k, v of dtype torch.float8_e4m3fn with
keyword-only q_descale, k_descale, v_descale, float32 (batch, kv_heads) each
(None: 1), run the forward of q * q_descale, k * k_descale, v * v_descale on
fa3_wgmma_sm90 (sm_90a; head_dim 64, 128 or 256, no score modifications) and return a
bfloat16 output (out_dtype=torch.float16 for half); flash_attn_varlen_func takes them
too, one descale row per sequence (fp8.quantize(x, kv_heads, cu_seqlens)). There is no
FP8 backward.

What flashlab does not have raises instead of being ignored: dropout
(dropout_p > 0), paged K/V in the variable-length call (block_table), and in
flash_attn_with_kvcache rotary embedding (rotary_cos/rotary_sin),
cache_batch_idx and cache_leftpad.
With return_attn_probs=True the calls return (out, softmax_lse, S_dmask), S_dmask
an empty tensor as flash-attn's is without dropout (flashlab has no dropout and
never forms the probabilities). window_size items may be ints or integer tensors
(a CUDA tensor is read on the host: a sync), any negative value unbounded, as in
flash-attn.

Values that live on the GPU (cu_seqlens, cache_seqlens, block_table) are never
read on the host unless strict checks are on (set_strict_checks(True) or
FLASHLAB_STRICT_CHECKS=1): the kernels keep in bounds whatever they hold and
record a bad one, which the next call or check_errors() raises. So no call
syncs the host, and every call can be captured in a CUDA graph.

Any head dim up to 256 works, as in flash-attn: the operators pad to the next
head dim the chosen kernel has and slice the result, with the softmax scale
still 1/sqrt(original head dim) (done in the C++ API, not here).
"""

from __future__ import annotations

import numbers
import operator
from typing import Optional, Sequence, Tuple, Union

import torch

from . import _ops

ops = torch.ops.flashlab


def _contiguous_last_dim(x):
    return x if x is None or x.stride(-1) == 1 else x.contiguous()


def _check_common(function, dropout_p=0.0, softcap=0.0, alibi_slopes=None, kernel="auto",
                  softmax_scale=None, sinks=None):
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"{function}: flashlab has no dropout; dropout_p must be 0.0, got {dropout_p!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or softcap < 0:
        raise ValueError(f"{function}: softcap must be a float >= 0 (0: off); got {softcap!r}")
    for name, value in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"{function}: {name} must be a float32 tensor or None; got a "
                            f"{type(value).__name__}")
    if not isinstance(kernel, str):
        raise TypeError(f"{function}: kernel must be a str, got {type(kernel).__name__}")
    if kernel != "auto" and kernel not in _ops._kernels:
        raise ValueError(
            f"{function}: unknown kernel {kernel!r}; registered kernels: "
            f"{', '.join(_ops._kernels)} (or 'auto')")
    if softmax_scale is not None and (isinstance(softmax_scale, bool)
                                      or not isinstance(softmax_scale, numbers.Real)):
        raise TypeError(
            f"{function}: softmax_scale must be a float or None, got {type(softmax_scale).__name__}")


def _window_item(value):
    """One side of a window as an int (any negative: -1, unbounded), or None when it is
    neither an int nor an integer tensor of one element."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype.is_floating_point or value.dtype.is_complex \
                or value.dtype == torch.bool:
            return None
        value = int(value.item())  # a CUDA tensor costs a sync here, as in flash-attn
    elif isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return max(int(value), -1)


def _window(function, window_size) -> Tuple[int, int]:
    """(left, right) as flash-attn takes it: a pair of ints or integer tensors (a 2-element
    tensor too, as torch.randint(0, n, (2,)) makes), any negative value unbounded."""
    message = (f"{function}: window_size must be a pair (left, right) of ints or integer "
               f"tensors (negative: unbounded); got {window_size!r}")
    if isinstance(window_size, torch.Tensor) and window_size.dim() != 1:
        raise ValueError(message)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(message) from None
    left, right = _window_item(left), _window_item(right)
    if left is None or right is None:
        raise ValueError(message)
    return left, right


def _scale(softmax_scale):
    return None if softmax_scale is None else float(softmax_scale)


def _result(out, lse, return_attn_probs):
    # flash-attn's third item, the attention probabilities, is an empty tensor
    # without dropout: flashlab has no dropout and never forms them.
    return (out, lse, out.new_empty((0,))) if return_attn_probs else out


def _as_int(function, name, value) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{function}: {name} must be an int, got {type(value).__name__}") from None


# ---------------------------------------------------------------------------
# Fixed-length batches.


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel="auto",
    sinks=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Attention of q (batch, seqlen_q, heads, head_dim) over k, v (batch, seqlen_k,
    kv_heads, head_dim); causal and window_size (left, right) align bottom-right.
    Returns out (batch, seqlen_q, heads, head_dim), or (out, softmax_lse (batch, heads,
    seqlen_q) float32, None) with return_attn_probs. Differentiable in q, k, v (and sinks);
    deterministic=True makes the backward bitwise reproducible. softcap, alibi_slopes and
    sinks: the score modifications of the module docstring. float8_e4m3fn q, k, v with
    q_descale, k_descale, v_descale (and out_dtype): the FP8 forward of the module docstring."""
    _check_common("flash_attn_func", dropout_p, softcap, alibi_slopes, kernel, softmax_scale, sinks)
    left, right = _window("flash_attn_func", window_size)
    q, k, v = (_contiguous_last_dim(x) for x in (q, k, v))
    if q.dtype == torch.float8_e4m3fn:
        if softcap or alibi_slopes is not None or sinks is not None:
            raise NotImplementedError("flash_attn_func: the float8_e4m3fn forward applies no softcap, "
                                      "alibi_slopes or sinks")
        out, lse = ops.fwd_fp8(q, k, v, q_descale, k_descale, v_descale, _scale(softmax_scale), bool(causal),
                               left, right, out_dtype, kernel)
        return _result(out, lse, return_attn_probs)
    if q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not None:
        raise ValueError(f"flash_attn_func: q_descale, k_descale, v_descale and out_dtype are for "
                         f"torch.float8_e4m3fn q, k, v; got {q.dtype}")
    out, lse = ops.fwd(q, k, v, _scale(softmax_scale), bool(causal), left, right,
                       bool(deterministic), kernel, float(softcap), alibi_slopes, sinks)
    return _result(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel="auto",
    sinks=None,
):
    """flash_attn_func on qkv (batch, seqlen, 3, heads, head_dim): q, k, v are views of it."""
    _check_common("flash_attn_qkvpacked_func", dropout_p, softcap, alibi_slopes, kernel,
                  softmax_scale, sinks)
    left, right = _window("flash_attn_qkvpacked_func", window_size)
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError("flash_attn_qkvpacked_func: qkv must be (batch, seqlen, 3, heads, "
                         f"head_dim); got shape {tuple(qkv.shape)}")
    q, k, v = (_contiguous_last_dim(x) for x in qkv.unbind(2))
    out, lse = ops.fwd(q, k, v, _scale(softmax_scale), bool(causal), left, right,
                       bool(deterministic), kernel, float(softcap), alibi_slopes, sinks)
    return _result(out, lse, return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel="auto",
    sinks=None,
):
    """flash_attn_func on q and kv (batch, seqlen_k, 2, kv_heads, head_dim)."""
    _check_common("flash_attn_kvpacked_func", dropout_p, softcap, alibi_slopes, kernel,
                  softmax_scale, sinks)
    left, right = _window("flash_attn_kvpacked_func", window_size)
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError("flash_attn_kvpacked_func: kv must be (batch, seqlen_k, 2, kv_heads, "
                         f"head_dim); got shape {tuple(kv.shape)}")
    k, v = (_contiguous_last_dim(x) for x in kv.unbind(2))
    out, lse = ops.fwd(_contiguous_last_dim(q), k, v, _scale(softmax_scale), bool(causal), left,
                       right, bool(deterministic), kernel, float(softcap), alibi_slopes, sinks)
    return _result(out, lse, return_attn_probs)


# ---------------------------------------------------------------------------
# Variable-length batches: sequences packed one after another, cu_seqlens the
# int32 prefix sums of their lengths (batch + 1), on q's device.


def _varlen(function, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
            softmax_scale, causal, window_size, deterministic, return_attn_probs, kernel,
            softcap, alibi_slopes, sinks, fp8_arguments=(None, None, None, None)):
    left, right = _window(function, window_size)
    max_seqlen_q = _as_int(function, "max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _as_int(function, "max_seqlen_k", max_seqlen_k)
    q, k, v = (_contiguous_last_dim(x) for x in (q, k, v))
    if q.dtype == torch.float8_e4m3fn:
        if softcap or alibi_slopes is not None or sinks is not None:
            raise NotImplementedError(f"{function}: the float8_e4m3fn forward applies no softcap, "
                                      "alibi_slopes or sinks")
        out, lse = ops.varlen_fwd_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      *fp8_arguments[:3], _scale(softmax_scale), bool(causal), left, right,
                                      fp8_arguments[3], kernel)
        return _result(out, lse, return_attn_probs)
    if any(argument is not None for argument in fp8_arguments):
        raise ValueError(f"{function}: q_descale, k_descale, v_descale and out_dtype are for "
                         f"torch.float8_e4m3fn q, k, v; got {q.dtype}")
    out, lse = ops.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              _scale(softmax_scale), bool(causal), left, right,
                              bool(deterministic), kernel, float(softcap), alibi_slopes, sinks)
    return _result(out, lse, return_attn_probs)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    kernel="auto",
    sinks=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Attention of each packed sequence: q (total_q, heads, head_dim), k, v (total_k,
    kv_heads, head_dim). Returns out (total_q, heads, head_dim), or (out, softmax_lse
    (heads, total_q), None) with return_attn_probs. float8_e4m3fn q, k, v with q_descale,
    k_descale, v_descale (float32 (sequences, kv_heads)) and out_dtype: the FP8 forward."""
    function = "flash_attn_varlen_func"
    _check_common(function, dropout_p, softcap, alibi_slopes, kernel, softmax_scale, sinks)
    if block_table is not None:
        raise NotImplementedError(
            f"{function}: flashlab's variable-length attention takes no paged K/V; block_table "
            "must be None (flash_attn_with_kvcache takes a paged cache)")
    return _varlen(function, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, window_size, deterministic, return_attn_probs, kernel,
                   softcap, alibi_slopes, sinks, (q_descale, k_descale, v_descale, out_dtype))


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel="auto",
    sinks=None,
):
    """flash_attn_varlen_func on qkv (total, 3, heads, head_dim)."""
    function = "flash_attn_varlen_qkvpacked_func"
    _check_common(function, dropout_p, softcap, alibi_slopes, kernel, softmax_scale, sinks)
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"{function}: qkv must be (total, 3, heads, head_dim); got shape "
                         f"{tuple(qkv.shape)}")
    q, k, v = qkv.unbind(1)
    return _varlen(function, q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                   softmax_scale, causal, window_size, deterministic, return_attn_probs, kernel,
                   softcap, alibi_slopes, sinks)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    kernel="auto",
    sinks=None,
):
    """flash_attn_varlen_func on q and kv (total_k, 2, kv_heads, head_dim)."""
    function = "flash_attn_varlen_kvpacked_func"
    _check_common(function, dropout_p, softcap, alibi_slopes, kernel, softmax_scale, sinks)
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"{function}: kv must be (total_k, 2, kv_heads, head_dim); got shape "
                         f"{tuple(kv.shape)}")
    k, v = kv.unbind(1)
    return _varlen(function, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                   softmax_scale, causal, window_size, deterministic, return_attn_probs, kernel,
                   softcap, alibi_slopes, sinks)


# ---------------------------------------------------------------------------
# Decoding with a KV cache.


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
    cache_batch_idx: Optional[torch.Tensor] = None,
    cache_leftpad: Optional[torch.Tensor] = None,
    block_table: Optional[torch.Tensor] = None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    kernel="auto",
    sinks=None,
):
    """Attention of q (batch, seqlen_q, heads, head_dim) over a KV cache, contiguous
    (batch, capacity, kv_heads, head_dim) or, with block_table (batch, pages per
    sequence) int32, paged (num_pages, page_size, kv_heads, head_dim). With k, v
    (batch, seqlen_new, kv_heads, head_dim) the new keys/values are written into
    k_cache/v_cache in place at rows cache_seqlens[b] ... before attending; sequence
    b sees its first cache_seqlens[b] + seqlen_new keys. cache_seqlens: an int for
    every sequence, an int32 (batch,) tensor, or None (every cache full). num_splits:
    0 = the kernel's heuristic. Returns out, or (out, softmax_lse) with
    return_softmax_lse. No backward (as in flash-attn)."""
    function = "flash_attn_with_kvcache"
    _check_common(function, 0.0, softcap, alibi_slopes, kernel, softmax_scale, sinks)
    if rotary_cos is not None or rotary_sin is not None:
        raise NotImplementedError(
            f"{function}: flashlab applies no rotary embedding; rotary_cos and rotary_sin must be "
            "None (rotate q and k before the call)")
    if cache_batch_idx is not None:
        raise NotImplementedError(
            f"{function}: cache_batch_idx is not supported; it must be None (sequence b uses "
            "cache entry b, or the pages block_table[b] names)")
    if cache_leftpad is not None:
        raise NotImplementedError(
            f"{function}: cache_leftpad is not supported; it must be None (every cache starts at "
            "row 0)")
    if (k is None) != (v is None):
        raise ValueError(f"{function}: k and v go together (both new keys and values, or neither); "
                         f"got k {'None' if k is None else 'a tensor'}, v "
                         f"{'None' if v is None else 'a tensor'}")
    left, right = _window(function, window_size)
    num_splits = _as_int(function, "num_splits", num_splits)
    if num_splits < 0:
        raise ValueError(f"{function}: num_splits must be >= 0 (0: the kernel's heuristic); got "
                         f"{num_splits}")
    if isinstance(cache_seqlens, bool):
        raise TypeError(f"{function}: cache_seqlens must be an int, an int32 tensor or None; got a "
                        "bool")
    if isinstance(cache_seqlens, numbers.Integral):
        if cache_seqlens < 0:
            raise ValueError(f"{function}: cache_seqlens must be >= 0; got {cache_seqlens}")
        cache_seqlens = torch.full((q.shape[0],), int(cache_seqlens), dtype=torch.int32,
                                   device=k_cache.device)
    elif cache_seqlens is not None:
        if not isinstance(cache_seqlens, torch.Tensor):
            raise TypeError(f"{function}: cache_seqlens must be an int, an int32 tensor or None; "
                            f"got {type(cache_seqlens).__name__}")
        if cache_seqlens.dtype != torch.int32:
            raise ValueError(f"{function}: cache_seqlens must have dtype torch.int32; got "
                             f"{cache_seqlens.dtype}")
        cache_seqlens = cache_seqlens.contiguous()
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            raise ValueError(f"{function}: block_table must be an int32 tensor (batch, pages per "
                             f"sequence); got {getattr(block_table, 'dtype', type(block_table))}")
        block_table = block_table.contiguous()
    q, k, v = (_contiguous_last_dim(x) for x in (q, k, v))
    out, lse = ops.fwd_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table,
                               _scale(softmax_scale), bool(causal), left, right, num_splits,
                               kernel, float(softcap), alibi_slopes, sinks)
    return (out, lse) if return_softmax_lse else out
