"""Attention functions as a user of flashlab.testing writes them (torch code, flash-attn's
signature), for the flashlab.testing tests and the CLI: a correct one, and ones with a
planted error."""
import torch

from attention_reference import attention_ref, varlen_attention_ref


def torch_attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, sinks=None):
    """Correct: float32 math, out in q's dtype, lse (batch, heads, seqlen_q) natural log."""
    upcast = [x.float() for x in (q, k, v)]
    out, lse = attention_ref(*upcast, causal=causal, window=window_size, softmax_scale=softmax_scale,
                             softcap=softcap, alibi_slopes=alibi_slopes,
                             sinks=None if sinks is None else sinks.float())
    return out.to(q.dtype), lse


def torch_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                           softmax_scale=None):
    out, lse = varlen_attention_ref(q.float(), k.float(), v.float(), cu_seqlens_q, cu_seqlens_k, causal=causal,
                                    softmax_scale=softmax_scale)
    return out.to(q.dtype), lse


def off_by_one_element(q, k, v, causal=False, softmax_scale=None):
    """out[1, 100, 3, 5] (batch, row, head, col) off by 0.5: a bug in query tile 1 at 64-row tiles."""
    out, lse = torch_attention(q, k, v, causal, softmax_scale)
    out = out.clone()
    out[1, 100, 3, 5] += 0.5
    return out, lse


def skips_last_row(q, k, v, causal=False, softmax_scale=None, out=None):
    """Writes every row of `out` but the last: the poisoned element stays NaN."""
    result, _ = torch_attention(q, k, v, causal, softmax_scale)
    out[:, :-1] = result[:, :-1]
    return out


def out_only(q, k, v, causal=False, softmax_scale=None):
    return torch_attention(q, k, v, causal, softmax_scale)[0]


def lse_in_log2(q, k, v, causal=False, softmax_scale=None):
    out, lse = torch_attention(q, k, v, causal, softmax_scale)
    return out, lse / torch.log(torch.tensor(2.0))


def bhsd_attention(q, k, v, causal=False, softmax_scale=None):
    """Takes and returns (batch, heads, seqlen, head_dim), as SDPA and Triton's tutorial do."""
    out, lse = torch_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, softmax_scale)
    return out.transpose(1, 2), lse


class _WrongKeyGradient(torch.autograd.Function):
    """Identity forward on k; the backward doubles dk of key row 70 (kv head 1)."""

    @staticmethod
    def forward(ctx, k):
        return k.view_as(k)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        grad[0, 70, 1] *= 2
        return grad


def wrong_dk_row(q, k, v, causal=False, softmax_scale=None):
    return torch_attention(q, _WrongKeyGradient.apply(k), v, causal, softmax_scale)
