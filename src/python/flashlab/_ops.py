"""Fake kernels and autograd formulas of the flashlab::* operators.

The C++ extension defines the schemas and the CUDA kernels; what the
operators' outputs look like (for FakeTensor, torch.compile and the meta
device) and how they differentiate is said here, with torch.library. Every
output is a new contiguous tensor: out like q, lse float32 (batch, heads,
seqlen_q) or, variable-length, (heads, total_q); dq, dk, dv like q, k, v.
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
              deterministic=False, kernel_name="auto"):
    batch, seqlen_q, heads, _ = q.shape
    return _new_contiguous(q), _new_contiguous(q, (batch, heads, seqlen_q), torch.float32)


@torch.library.register_fake("flashlab::varlen_fwd")
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale=None, causal=False, window_left=-1, window_right=-1,
                     deterministic=False, kernel_name="auto"):
    total_q, heads, _ = q.shape
    return _new_contiguous(q), _new_contiguous(q, (heads, total_q), torch.float32)


@torch.library.register_fake("flashlab::bwd")
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale=None, causal=False, window_left=-1,
              window_right=-1, deterministic=False, kernel_name="auto"):
    return _new_contiguous(q), _new_contiguous(k), _new_contiguous(v)


@torch.library.register_fake("flashlab::varlen_bwd")
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                     max_seqlen_k, softmax_scale=None, causal=False, window_left=-1,
                     window_right=-1, deterministic=False, kernel_name="auto"):
    return _new_contiguous(q), _new_contiguous(k), _new_contiguous(v)


@torch.library.register_fake("flashlab::fwd_kvcache")
def _fwd_kvcache_fake(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                      softmax_scale=None, causal=False, window_left=-1, window_right=-1,
                      num_splits=0, kernel_name="auto"):
    # k_cache and v_cache are written in place (the schema's Tensor(a!)): no output aliases them.
    batch, seqlen_q, heads, _ = q.shape
    return _new_contiguous(q), _new_contiguous(q, (batch, heads, seqlen_q), torch.float32)


# ---------------------------------------------------------------------------
# Autograd. The backward runs the forward's kernel when that kernel has a
# backward pass, else "auto" (the first registered kernel with one): a kernel's
# out and lse are plain attention output and natural-log LSE, whichever kernel
# wrote them. lse is an output without a gradient (as in flash-attn): it is
# marked non-differentiable.

_kernels: dict[str, KernelInfo] = {}


def set_kernels(kernels: dict[str, KernelInfo]) -> None:
    _kernels.update(kernels)


def backward_kernel(kernel: str) -> str:
    info = _kernels.get(kernel)
    return kernel if info is not None and info.backward else "auto"


def _setup_fwd(ctx, inputs, output):
    q, k, v, softmax_scale, causal, window_left, window_right, deterministic, kernel = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (softmax_scale, causal, window_left, window_right, deterministic,
                   backward_kernel(kernel))
    ctx.mark_non_differentiable(lse)


def _backward_fwd(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = ops.bwd(grad_out.contiguous(), q, k, v, out, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None


torch.library.register_autograd("flashlab::fwd", _backward_fwd, setup_context=_setup_fwd)


def _setup_varlen_fwd(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
     window_left, window_right, deterministic, kernel) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.options = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
                   deterministic, backward_kernel(kernel))
    ctx.mark_non_differentiable(lse)


def _backward_varlen_fwd(ctx, grad_out, grad_lse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = ops.varlen_bwd(grad_out.contiguous(), q, k, v, out, lse, cu_seqlens_q,
                                cu_seqlens_k, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("flashlab::varlen_fwd", _backward_varlen_fwd,
                                setup_context=_setup_varlen_fwd)
