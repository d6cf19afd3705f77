"""Fake kernels of the flashlab::* operators.

The C++ extension defines the schemas, the CUDA kernels and the autograd of
the forward ops; what the operators' outputs look like (for FakeTensor,
torch.compile and the meta device) is said here, with torch.library. Every
output is a new contiguous tensor: out like q, lse float32 (batch, heads,
seqlen_q) or, variable-length, (heads, total_q); dq, dk, dv like q, k, v;
dsinks float32 (heads) with sinks, else (0,).
"""

from __future__ import annotations

import torch

from ._library import KernelInfo

ops = torch.ops.flashlab


def _new_contiguous(like: torch.Tensor, shape=None, dtype=None) -> torch.Tensor:
    return like.new_empty(like.shape if shape is None else shape, dtype=dtype or like.dtype)


# ---------------------------------------------------------------------------
# Fake kernels: shapes, dtypes and devices only (no input is read).


@torch.library.register_fake("flashlab::fwd")
def _fwd_fake(q, k, v, softmax_scale=None, causal=False, window_left=-1, window_right=-1,
              deterministic=False, kernel_name="auto", softcap=0.0, alibi_slopes=None, sinks=None,
              sm_margin=0):
    batch, seqlen_q, heads, _ = q.shape
    out_dtype = torch.bfloat16 if q.dtype == torch.float8_e4m3fn else None  # e4m3's default output
    return _new_contiguous(q, dtype=out_dtype), _new_contiguous(q, (batch, heads, seqlen_q), torch.float32)


@torch.library.register_fake("flashlab::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale=None, causal=False, window_left=-1, window_right=-1,
                     deterministic=False, kernel_name="auto", softcap=0.0, alibi_slopes=None,
                     sinks=None, sm_margin=0):
    total_q, heads, _ = q.shape
    return _new_contiguous(q), _new_contiguous(q, (heads, total_q), torch.float32)


def _dsinks_fake(q, sinks):
    return q.new_empty((0,) if sinks is None else tuple(sinks.shape), dtype=torch.float32)


@torch.library.register_fake("flashlab::bwd")
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale=None, causal=False, window_left=-1,
              window_right=-1, deterministic=False, kernel_name="auto", softcap=0.0,
              alibi_slopes=None, sinks=None):
    return _new_contiguous(q), _new_contiguous(k), _new_contiguous(v), _dsinks_fake(q, sinks)


@torch.library.register_fake("flashlab::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale=None, causal=False, window_left=-1,
                     window_right=-1, deterministic=False, kernel_name="auto", softcap=0.0,
                     alibi_slopes=None, sinks=None):
    return _new_contiguous(q), _new_contiguous(k), _new_contiguous(v), _dsinks_fake(q, sinks)


@torch.library.register_fake("flashlab::fwd_fp8")
def _fwd_fp8_fake(q, k, v, q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                  window_left=-1, window_right=-1, out_dtype=None, kernel_name="auto"):
    batch, seqlen_q, heads, _ = q.shape
    return (_new_contiguous(q, dtype=out_dtype or torch.bfloat16),
            _new_contiguous(q, (batch, heads, seqlen_q), torch.float32))


@torch.library.register_fake("flashlab::varlen_fwd_fp8")
def _varlen_fwd_fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, q_descale=None,
                         k_descale=None, v_descale=None, softmax_scale=None, causal=False, window_left=-1,
                         window_right=-1, out_dtype=None, kernel_name="auto"):
    total_q, heads, _ = q.shape
    return (_new_contiguous(q, dtype=out_dtype or torch.bfloat16),
            _new_contiguous(q, (heads, total_q), torch.float32))


@torch.library.register_fake("flashlab::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                      softmax_scale=None, causal=False, window_left=-1, window_right=-1,
                      num_splits=0, kernel_name="auto", softcap=0.0, alibi_slopes=None,
                      sinks=None):
    # k_cache and v_cache are written in place (the schema's Tensor(a!)): no output aliases them.
    batch, seqlen_q, heads, _ = q.shape
    return _new_contiguous(q), _new_contiguous(q, (batch, heads, seqlen_q), torch.float32)


# ---------------------------------------------------------------------------
# The registry as the Python API reads it (kernel names for argument errors).
@torch.library.register_fake("flashlab::merge_attention_states_")
def _merge_attention_states_fake(out, lse, block_out, block_lse):
    return None


# Autograd of flashlab::fwd and varlen_fwd is registered in C++ (flashlab_ops.cpp):
# a Python registration cost more host time a call than the kernel takes.

_kernels: dict[str, KernelInfo] = {}


def set_kernels(kernels: dict[str, KernelInfo]) -> None:
    _kernels.update(kernels)
