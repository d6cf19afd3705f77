"""Context parallelism (issue 34), first part: ring and Ulysses attention over torch.distributed.

Each rank holds its shard of the sequence, q, k, v of shape (batch, seqlen / world,
heads or kv_heads, head_dim). ring_flash_attn_func passes the K/V shards around the
ring (batch_isend_irecv: NCCL on GPUs, gloo on CPUs), one step per rank: at each step
the rank attends its queries to the K/V it holds with a block operation that returns
(out, lse), and merges the partial result by its LSE (merge_partial: the split-KV
combine's rule). The next K/V travel while the current block computes: NCCL runs the
transfers on its own stream, which waits for the tensors sent to be ready, and the
compute stream waits for it only when the received K/V are used (request.wait() on a
CUDA stream blocks no host thread). NCCL's transfer kernels need SMs of their own while
the block runs: a persistent forward (fa3_wgmma_sm90: one CTA per SM, each holding a
whole SM) that starts first leaves them none, and the transfer then waits for the whole
block; so the forward steps a transfer runs beside leave sm_margin SMs free (the
kernel's sm_margin, as FA3's). GQA sends only the kv heads. The backward runs the
same ring: each rank adds its dQ locally; the K/V for the next step leave before the
current block starts, and each block's dK/dV accumulator follows its K/V one step
behind (in flight during the next block), gathering every rank's share, and reaches
its owner after the last step.

Causal attention uses the zigzag layout (zigzag_shard / zigzag_unshard): the sequence
is cut into 2 x world chunks and rank r holds chunks r and 2 x world - 1 - r, so every
rank does the same causal work; on each step a rank attends all its queries to the
first half of an earlier rank's K/V, or the second half of its queries to all of a later
rank's K/V (the rest is masked and skipped), and its own shard causally.
ring_flash_attn_varlen_func is the packed-sequence twin: each rank holds every
sequence's zigzag shard (zigzag_shard_varlen), and a shard's halves are each
sequence's halves (the ring is written once over the two layouts).

ulysses_flash_attn_func is the other scheme (DeepSpeed-Ulysses): two all-to-alls turn
the sequence shards into head shards, so each rank attends the whole sequence for
heads / world of the heads (contiguous shards, causal as it is), and back. It needs the
head count divisible by the world size (kv heads fewer than that are repeated); it
moves 4 q-sized tensors by all-to-all where the ring moves world - 1 K/V shards, and
runs one large attention instead of world smaller ones. Choose Ulysses when heads
divide by the world size and the all-to-all is fast (one node); the ring otherwise,
past one node, or when heads are few.

The block operation is pluggable (BlockOps): flashlab_block_ops runs flashlab's
kernels (torch.ops.flashlab.fwd / bwd and their varlen forms: the backward of a block
given the final out and lse is exactly a block's share of the gradients);
reference_block_ops is plain torch math (the CPU tests run the schemes with it on
gloo). scripts/bench_distributed.py (torchrun) times the ring and Ulysses against torch's
context_parallel over SDPA (docs/benchmarks.md has its figures on 4 H100s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist


# ---------------------------------------------------------------------------
# The zigzag layout.


def zigzag_shard(x: torch.Tensor, rank: int, world_size: int, dim: int = 1) -> torch.Tensor:
    """Rank `rank`'s shard of the full sequence x along `dim`: chunks rank and
    2 * world_size - 1 - rank of 2 * world_size equal chunks, concatenated."""
    if x.shape[dim] % (2 * world_size) != 0:
        raise ValueError(f"zigzag_shard: the sequence length {x.shape[dim]} must be a multiple of "
                         f"2 x world_size = {2 * world_size}")
    chunks = x.chunk(2 * world_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim)


def zigzag_unshard(shards, dim: int = 1) -> torch.Tensor:
    """The full sequence from every rank's zigzag shard (shards[r] is rank r's)."""
    world_size = len(shards)
    chunks = [None] * (2 * world_size)
    for rank, shard in enumerate(shards):
        first, second = shard.chunk(2, dim=dim)
        chunks[rank], chunks[2 * world_size - 1 - rank] = first, second
    return torch.cat(chunks, dim=dim)


def zigzag_shard_varlen(x: torch.Tensor, cu_seqlens, rank: int, world_size: int):
    """Rank `rank`'s rows of packed sequences x (total, ...) with prefix sums cu_seqlens:
    every sequence's zigzag shard, back to back. Returns (rows, cu_seqlens of the shard,
    its max length); each length must be a multiple of 2 x world_size."""
    bounds = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)
    parts = [zigzag_shard(x[start:end], rank, world_size, dim=0) for start, end in zip(bounds[:-1], bounds[1:])]
    lengths = [part.shape[0] for part in parts]
    local = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    device = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else x.device
    return torch.cat(parts, dim=0), local.to(device), max(lengths, default=0)


def zigzag_unshard_varlen(shards, cu_seqlens) -> torch.Tensor:
    """The packed sequences from every rank's zigzag_shard_varlen rows (shards[r] is rank r's)."""
    bounds = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)
    world_size = len(shards)
    offsets = [0] * world_size
    sequences = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        rows = (end - start) // world_size
        sequences.append(zigzag_unshard([shard[offsets[r]:offsets[r] + rows] for r, shard in enumerate(shards)],
                                        dim=0))
        offsets = [offset + rows for offset in offsets]
    return torch.cat(sequences, dim=0)


# ---------------------------------------------------------------------------
# Merging partial results by their LSE.


def merge_partial(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
                  block_lse: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The attention over the union of two key sets from each one's (out, lse):
    lse = log(exp(lse) + exp(block_lse)), out weighted by exp(lse_part - lse). out
    (batch, seqlen, heads, head_dim) with lse (batch, heads, seqlen), or packed out
    (total, heads, head_dim) with lse (heads, total). A row that sees no key in either
    keeps out 0 and lse -inf. On CUDA with a float32 accumulator the merge runs in place in
    one kernel (torch.ops.flashlab.merge_attention_states_, the split-KV combine's rule in
    common/lse_merge.h); elsewhere (the CPU tests) in torch operations."""
    if out.is_cuda and out.dtype == torch.float32 and lse.dtype == torch.float32:
        torch.ops.flashlab.merge_attention_states_(out, lse, block_out, block_lse.to(torch.float32))
        return out, lse
    merged = torch.logaddexp(lse, block_lse)
    finite = torch.isfinite(merged)
    safe = torch.where(finite, merged, torch.zeros_like(merged))
    weight = torch.where(finite, torch.exp(lse - safe), torch.zeros_like(merged))
    block_weight = torch.where(finite, torch.exp(block_lse - safe), torch.zeros_like(merged))
    # (batch, heads, seqlen) -> (batch, seqlen, heads, 1); (heads, total) -> (total, heads, 1)
    as_rows = lambda w: w.transpose(-1, -2).unsqueeze(-1)  # noqa: E731
    merged_out = out * as_rows(weight).to(out.dtype) + block_out.to(out.dtype) * as_rows(block_weight).to(out.dtype)
    return merged_out, merged


# ---------------------------------------------------------------------------
# Block operations.


@dataclass(frozen=True)
class BlockOps:
    """forward(q, k, v, causal, softmax_scale) -> (out, lse float32 (batch, heads, seqlen_q));
    backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic=False) -> (dq, dk,
    dv): one block's share of the gradients given the final out and lse (deterministic: the
    kernel's bitwise-reproducible mode). varlen_forward / varlen_backward:
    the same on packed rows, with (cu_seqlens_q, max_seqlen_q, cu_seqlens_k,
    max_seqlen_k) after v, lse (heads, total_q)."""
    forward: Callable
    backward: Callable
    varlen_forward: Optional[Callable] = None
    varlen_backward: Optional[Callable] = None

    def with_sm_margin(self, sm_margin: int) -> "BlockOps":
        """The forwards with sm_margin=... (flashlab's take it: SMs a persistent kernel
        leaves free); itself for 0, so block operations without the argument keep working."""
        if not sm_margin:
            return self
        varlen = partial(self.varlen_forward, sm_margin=sm_margin) if self.varlen_forward else None
        return replace(self, forward=partial(self.forward, sm_margin=sm_margin), varlen_forward=varlen)


def _flashlab_forward(q, k, v, causal, softmax_scale, sm_margin=0):
    out, lse = torch.ops.flashlab.fwd(q, k, v, softmax_scale, causal, -1, -1, False, "auto",
                                      sm_margin=sm_margin)
    return out, lse


def _flashlab_backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic=False):
    dq, dk, dv, _ = torch.ops.flashlab.bwd(dout, q, k, v, out, lse, softmax_scale, causal, -1, -1, deterministic,
                                           "auto")
    return dq, dk, dv


def _flashlab_varlen_forward(q, k, v, cu_q, max_q, cu_k, max_k, causal, softmax_scale, sm_margin=0):
    return torch.ops.flashlab.varlen_fwd(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, -1, -1, False,
                                         "auto", sm_margin=sm_margin)


def _flashlab_varlen_backward(dout, q, k, v, out, lse, cu_q, max_q, cu_k, max_k, causal, softmax_scale,
                              deterministic=False):
    dq, dk, dv, _ = torch.ops.flashlab.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, softmax_scale,
                                                  causal, -1, -1, deterministic, "auto")
    return dq, dk, dv


flashlab_block_ops = BlockOps(_flashlab_forward, _flashlab_backward, _flashlab_varlen_forward,
                              _flashlab_varlen_backward)


def _expand_kv(x, heads):
    return x if x.shape[2] == heads else x.repeat_interleave(heads // x.shape[2], dim=2)


def _reference_probabilities(q, k, causal, softmax_scale, lse=None):
    """scores (batch, heads, sq, sk) scaled and masked (bottom-right), and P = exp(s - lse)."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, _expand_kv(k, q.shape[2])) * softmax_scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        rows = torch.arange(sq, device=q.device)[:, None]
        cols = torch.arange(sk, device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows + sk - sq, float("-inf"))
    if lse is None:
        return scores
    return scores, torch.exp(scores - lse.to(scores.dtype)[..., None])


def _reference_forward(q, k, v, causal, softmax_scale, sm_margin=0):  # sm_margin: no SMs to leave
    scores = _reference_probabilities(q, k, causal, softmax_scale)
    lse = torch.logsumexp(scores, dim=-1)
    probabilities = torch.where(torch.isfinite(lse)[..., None], torch.exp(scores - lse[..., None]),
                                torch.zeros_like(scores))
    out = torch.einsum("bhqk,bkhd->bqhd", probabilities, _expand_kv(v, q.shape[2]))
    return out.to(q.dtype), lse.to(_accumulator_dtype(q))


def _reference_backward(dout, q, k, v, out, lse, causal, softmax_scale, deterministic=False):
    heads, kv_heads = q.shape[2], k.shape[2]
    _, probabilities = _reference_probabilities(q, k, causal, softmax_scale, lse)
    probabilities = torch.nan_to_num(probabilities, nan=0.0)
    ve = _expand_kv(v, heads)
    row_d = (dout * out).sum(-1).transpose(1, 2)[..., None]  # (batch, heads, sq, 1)
    dv = torch.einsum("bhqk,bqhd->bkhd", probabilities, dout)
    dp = torch.einsum("bqhd,bkhd->bhqk", dout, ve)
    ds = probabilities * (dp - row_d) * softmax_scale
    dq = torch.einsum("bhqk,bkhd->bqhd", ds, _expand_kv(k, heads))
    dk = torch.einsum("bhqk,bqhd->bkhd", ds, q)
    if heads != kv_heads:  # sum each kv head's group
        group = heads // kv_heads
        dk = dk.unflatten(2, (kv_heads, group)).sum(3)
        dv = dv.unflatten(2, (kv_heads, group)).sum(3)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _sequences(cu_q, cu_k):
    return zip(cu_q.tolist()[:-1], cu_q.tolist()[1:], cu_k.tolist()[:-1], cu_k.tolist()[1:])


def _reference_varlen_forward(q, k, v, cu_q, max_q, cu_k, max_k, causal, softmax_scale, sm_margin=0):
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=_accumulator_dtype(q), device=q.device)
    for qs, qe, ks, ke in _sequences(cu_q, cu_k):
        if qe > qs and ke > ks:
            o, l = _reference_forward(q[None, qs:qe], k[None, ks:ke], v[None, ks:ke], causal, softmax_scale)
            out[qs:qe], lse[:, qs:qe] = o[0], l[0]
    return out, lse


def _reference_varlen_backward(dout, q, k, v, out, lse, cu_q, max_q, cu_k, max_k, causal, softmax_scale,
                               deterministic=False):
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for qs, qe, ks, ke in _sequences(cu_q, cu_k):
        if qe > qs and ke > ks:
            g = _reference_backward(dout[None, qs:qe], q[None, qs:qe], k[None, ks:ke], v[None, ks:ke],
                                    out[None, qs:qe], lse[None, :, qs:qe], causal, softmax_scale)
            dq[qs:qe], dk[ks:ke], dv[ks:ke] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


reference_block_ops = BlockOps(_reference_forward, _reference_backward, _reference_varlen_forward,
                               _reference_varlen_backward)


# ---------------------------------------------------------------------------
# The ring.


class _Ring:
    """Point-to-point transfers to the next rank and from the previous one in `group`."""

    def __init__(self, group):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.world_size) if group is not None \
            else (self.rank + 1) % self.world_size
        self.previous = dist.get_global_rank(group, (self.rank - 1) % self.world_size) if group is not None \
            else (self.rank - 1) % self.world_size

    def start(self, tensors):
        """Sends `tensors` on and receives the previous rank's into new buffers; returns
        (requests, received)."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.previous, self.group) for r in received]
        return dist.batch_isend_irecv(ops), received

    @staticmethod
    def wait(requests):
        for request in requests:
            request.wait()


def _step_shape(causal, rank, source):
    """Which part of a step computes under the zigzag layout: ("all" | "queries_second" |
    "keys_first", causal)."""
    if not causal:
        return "all", False
    if source == rank:
        return "all", True
    return ("keys_first", False) if source < rank else ("queries_second", False)


def _accumulator_dtype(x):
    """float32 for 16-bit and float32 inputs, float64 for float64 (the CPU tests)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class _DenseLayout:
    """(batch, rows, heads, d) shards, lse (batch, heads, rows); a zigzag shard's halves
    are its first and last rows / 2."""

    def __init__(self, rows):
        self.half = rows // 2

    def lse_shape(self, q):
        return (q.shape[0], q.shape[2], q.shape[1])

    def first(self, x):
        return x[:, :self.half]

    def second(self, x):
        return x[:, self.half:]

    def second_lse(self, lse):
        return lse[..., self.half:].contiguous()

    def with_second(self, x, part):
        return torch.cat([x[:, :self.half], part], dim=1)

    def with_second_lse(self, lse, part):
        return torch.cat([lse[..., :self.half], part], dim=-1)

    def add_first(self, acc, part):
        acc[:, :self.half] += part

    def add_second(self, acc, part):
        acc[:, self.half:] += part

    def forward(self, ops, q, k, v, causal, scale, part):
        return ops.forward(q, k, v, causal, scale)

    def backward(self, ops, dout, q, k, v, out, lse, causal, scale, part, deterministic):
        return ops.backward(dout, q, k, v, out, lse, causal, scale, deterministic=deterministic)


class _VarlenLayout:
    """Packed (total, heads, d) shards of the sequences cu_seqlens (this rank's, int32
    prefix sums), lse (heads, total); a zigzag shard's halves are each sequence's first
    and last rows / 2 (index lists)."""

    def __init__(self, cu_seqlens, max_seqlen):
        bounds = cu_seqlens.tolist()  # the lengths on the host: one sync a call
        device = cu_seqlens.device
        first, second, halves = [], [], [0]
        for start, end in zip(bounds[:-1], bounds[1:]):
            half = (end - start) // 2
            first += range(start, start + half)
            second += range(start + half, end)
            halves.append(halves[-1] + half)
        self.first_index = torch.tensor(first, dtype=torch.long, device=device)
        self.second_index = torch.tensor(second, dtype=torch.long, device=device)
        self.cu_seqlens, self.max_seqlen = cu_seqlens, max_seqlen
        self.cu_halves = torch.tensor(halves, dtype=torch.int32, device=device)
        self.max_half = max_seqlen // 2

    def lse_shape(self, q):
        return (q.shape[1], q.shape[0])

    def first(self, x):
        return x.index_select(0, self.first_index)

    def second(self, x):
        return x.index_select(0, self.second_index)

    def second_lse(self, lse):
        return lse.index_select(1, self.second_index)

    def with_second(self, x, part):
        return x.index_copy(0, self.second_index, part)

    def with_second_lse(self, lse, part):
        return lse.index_copy(1, self.second_index, part)

    def add_first(self, acc, part):
        acc.index_add_(0, self.first_index, part)

    def add_second(self, acc, part):
        acc.index_add_(0, self.second_index, part)

    def _lengths(self, part):
        whole = (self.cu_seqlens, self.max_seqlen)
        halves = (self.cu_halves, self.max_half)
        return {"all": whole + whole, "keys_first": whole + halves, "queries_second": halves + whole}[part]

    def forward(self, ops, q, k, v, causal, scale, part):
        return ops.varlen_forward(q, k, v, *self._lengths(part), causal, scale)

    def backward(self, ops, dout, q, k, v, out, lse, causal, scale, part, deterministic):
        return ops.varlen_backward(dout, q, k, v, out, lse, *self._lengths(part), causal, scale,
                                   deterministic=deterministic)


def _ring_forward(q, k, v, causal, softmax_scale, ring: _Ring, ops: BlockOps, layout, sm_margin=0):
    acc = _accumulator_dtype(q)
    overlapped_ops = ops.with_sm_margin(sm_margin)  # for the steps a transfer runs beside
    out = torch.zeros_like(q, dtype=acc)
    lse = torch.full(layout.lse_shape(q), float("-inf"), dtype=acc, device=q.device)
    kv = (k, v)
    for step in range(ring.world_size):
        requests, received = ring.start(kv) if step + 1 < ring.world_size else ([], None)
        step_ops = overlapped_ops if requests else ops
        source = (ring.rank - step) % ring.world_size
        part, block_causal = _step_shape(causal, ring.rank, source)
        k_cur, v_cur = kv
        if part == "all":
            block_out, block_lse = layout.forward(step_ops, q, k_cur, v_cur, block_causal, softmax_scale, part)
            out, lse = merge_partial(out, lse, block_out, block_lse)
        elif part == "keys_first":
            block_out, block_lse = layout.forward(step_ops, q, layout.first(k_cur), layout.first(v_cur), False,
                                                  softmax_scale, part)
            out, lse = merge_partial(out, lse, block_out, block_lse)
        else:
            block_out, block_lse = layout.forward(step_ops, layout.second(q), k_cur, v_cur, False, softmax_scale,
                                                  part)
            merged_out, merged_lse = merge_partial(layout.second(out), layout.second_lse(lse), block_out,
                                                   block_lse)
            out = layout.with_second(out, merged_out)
            lse = layout.with_second_lse(lse, merged_lse)
        ring.wait(requests)
        if received is not None:
            kv = tuple(received)
    return out.to(q.dtype), lse.to(torch.float32) if acc == torch.float32 else lse


def _ring_backward(dout, q, k, v, out, lse, causal, softmax_scale, ring: _Ring, ops: BlockOps, layout,
                   deterministic=False):
    acc = _accumulator_dtype(q)
    dq = torch.zeros_like(q, dtype=acc)
    # Two transfers per step, each in flight while a block computes: the K/V the next
    # step needs leave before this step's block starts, and block `source`'s dK/dV
    # accumulator (every earlier rank's share of it) arrives during it; the accumulator
    # leaves with this rank's share added, and after the last step it reaches its owner.
    k_cur, v_cur = k, v
    gradient_requests, gradient_received = [], None
    for step in range(ring.world_size):
        last = step + 1 == ring.world_size
        kv_requests, kv_received = ring.start((k_cur, v_cur)) if not last else ([], None)
        source = (ring.rank - step) % ring.world_size
        part, block_causal = _step_shape(causal, ring.rank, source)
        if part == "all":
            dq_b, dk_b, dv_b = layout.backward(ops, dout, q, k_cur, v_cur, out, lse, block_causal, softmax_scale,
                                               part, deterministic)
            dq += dq_b.to(acc)
        elif part == "keys_first":
            dq_b, dk_b, dv_b = layout.backward(ops, dout, q, layout.first(k_cur), layout.first(v_cur), out, lse,
                                               False, softmax_scale, part, deterministic)
            dq += dq_b.to(acc)
        else:
            dq_b, dk_b, dv_b = layout.backward(ops, layout.second(dout), layout.second(q), k_cur, v_cur,
                                               layout.second(out), layout.second_lse(lse), False, softmax_scale,
                                               part, deterministic)
            layout.add_second(dq, dq_b.to(acc))
        ring.wait(gradient_requests)
        dk_acc, dv_acc = gradient_received if gradient_received is not None else \
            (torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc))
        if part == "keys_first":
            layout.add_first(dk_acc, dk_b.to(acc))
            layout.add_first(dv_acc, dv_b.to(acc))
        else:
            dk_acc += dk_b.to(acc)
            dv_acc += dv_b.to(acc)
        gradient_requests, gradient_received = ring.start((dk_acc, dv_acc))
        ring.wait(kv_requests)
        if kv_received is not None:
            k_cur, v_cur = kv_received
    ring.wait(gradient_requests)
    dk_acc, dv_acc = gradient_received
    return dq.to(q.dtype), dk_acc.to(k.dtype), dv_acc.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, group, ops, layout, deterministic, sm_margin):
        ring = _Ring(group)
        out, lse = _ring_forward(q, k, v, causal, softmax_scale, ring, ops, layout, sm_margin)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.softmax_scale, ctx.causal, ctx.group, ctx.ops, ctx.layout = softmax_scale, causal, group, ops, layout
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.causal, ctx.softmax_scale,
                                    _Ring(ctx.group), ctx.ops, ctx.layout, ctx.deterministic)
        return dq, dk, dv, None, None, None, None, None, None, None


# The ring's default sm_margin with flashlab's block operations: 4 H100s (NVLink), bf16,
# 128k tokens, 32/8 heads, d128 (session 26): the ring's forward efficiency 0.73 / 0.79
# (causal / not) with 0, 0.92 / 0.95 with 8, 0.89 / 0.92 with 16.
DEFAULT_RING_SM_MARGIN = 8


def _sm_margin(sm_margin, ops) -> int:
    if sm_margin is None:
        return DEFAULT_RING_SM_MARGIN if ops is flashlab_block_ops else 0
    if not isinstance(sm_margin, int) or isinstance(sm_margin, bool) or sm_margin < 0:
        raise ValueError(f"sm_margin (SMs the ring's forward blocks leave to NCCL) must be an int >= 0 or None; "
                         f"got {sm_margin!r}")
    return sm_margin


def ring_flash_attn_func(q, k, v, softmax_scale: Optional[float] = None, causal: bool = False,
                         group=None, block_ops: Optional[BlockOps] = None, return_lse: bool = False,
                         deterministic: bool = False, sm_margin: Optional[int] = None):
    """Attention over the whole sequence of which each rank of `group` (default: the
    world) holds one shard: q (batch, seqlen / world, heads, head_dim), k, v (batch,
    seqlen / world, kv_heads, head_dim); for causal, the zigzag shards (zigzag_shard).
    Returns the rank's out shard (and the LSE (batch, heads, seqlen / world) with
    return_lse); differentiable in q, k, v. block_ops: flashlab's kernels by default.
    deterministic: each block's backward in its deterministic mode; the ring adds the
    blocks' shares in a fixed order, so the gradients are then bitwise reproducible.
    sm_margin: SMs the forward blocks that run beside a K/V transfer leave to NCCL's
    kernels (a block operation's forward must then take sm_margin=, as flashlab's does);
    None: DEFAULT_RING_SM_MARGIN with flashlab's block operations, else 0."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"ring_flash_attn_func: q, k, v must be (batch, seqlen, heads, head_dim); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[1] != q.shape[1]:
        raise ValueError("ring_flash_attn_func: every rank's q and k/v shards hold the same rows; got "
                         f"{q.shape[1]} query and {k.shape[1]} key rows")
    if causal and q.shape[1] % 2 != 0:
        raise ValueError(f"ring_flash_attn_func: causal takes zigzag shards of two equal chunks; got "
                         f"{q.shape[1]} rows")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    ops = block_ops or flashlab_block_ops
    out, lse = _RingAttention.apply(q, k, v, scale, bool(causal), group, ops, _DenseLayout(q.shape[1]),
                                    bool(deterministic), _sm_margin(sm_margin, ops))
    return (out, lse) if return_lse else out


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen: int, softmax_scale: Optional[float] = None,
                                causal: bool = False, group=None, block_ops: Optional[BlockOps] = None,
                                return_lse: bool = False, deterministic: bool = False, sm_margin: Optional[int] = None):
    """ring_flash_attn_func for packed sequences: q (total / world, heads, head_dim), k, v
    (total / world, kv_heads, head_dim), this rank's rows of every sequence back to back;
    cu_seqlens (int32, on q's device) and max_seqlen describe the rank's rows (each
    sequence's length / world: zigzag_shard_varlen's). For causal every sequence's shard
    is its zigzag shard, of even length. Returns out (and lse (heads, total / world)).
    sm_margin as ring_flash_attn_func's."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"ring_flash_attn_varlen_func: q, k, v must be (total, heads, head_dim); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if causal and any(length % 2 for length in cu_seqlens.diff().tolist()):
        raise ValueError("ring_flash_attn_varlen_func: causal takes zigzag shards: every sequence's rows "
                         f"on a rank must be even; got lengths {cu_seqlens.diff().tolist()}")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    ops = block_ops or flashlab_block_ops
    out, lse = _RingAttention.apply(q, k, v, scale, bool(causal), group, ops,
                                    _VarlenLayout(cu_seqlens, int(max_seqlen)), bool(deterministic),
                                    _sm_margin(sm_margin, ops))
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------
# Ulysses: sequence shards <-> head shards by all-to-all.


def _all_to_all(x, group, split_dim, cat_dim):
    """x cut into world parts along split_dim, part j to rank j; the parts received
    concatenated along cat_dim (in rank order)."""
    world = dist.get_world_size(group)
    # One stacked tensor through all_to_all_single: gloo in torch 2.11 has no list all_to_all.
    sent = torch.stack(x.chunk(world, dim=split_dim))
    received = torch.empty_like(sent)
    dist.all_to_all_single(received, sent, group=group)
    return torch.cat(received.unbind(0), dim=cat_dim)


def _sequence_to_heads(x, group):
    """(batch, rows, heads, d) sequence shards -> (batch, rows x world, heads / world, d)."""
    return _all_to_all(x, group, split_dim=2, cat_dim=1)


def _heads_to_sequence(x, group):
    """The inverse: (batch, rows x world, heads / world, d) -> (batch, rows, heads, d)."""
    return _all_to_all(x, group, split_dim=1, cat_dim=2)


class _UlyssesAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, group, ops, deterministic):
        world = dist.get_world_size(group)
        if k.shape[2] % world != 0:  # too few kv heads: repeat them up to a multiple of the world
            repeat = world // math.gcd(world, k.shape[2])
            k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
            ctx.kv_repeat = repeat
        else:
            ctx.kv_repeat = 1
        qh, kh, vh = (_sequence_to_heads(x, group) for x in (q, k, v))
        out_h, lse_h = ops.forward(qh, kh, vh, causal, softmax_scale)
        ctx.save_for_backward(qh, kh, vh, out_h, lse_h)
        ctx.softmax_scale, ctx.causal, ctx.group, ctx.ops = softmax_scale, causal, group, ops
        ctx.deterministic = deterministic
        return _heads_to_sequence(out_h, group)

    @staticmethod
    def backward(ctx, dout):
        qh, kh, vh, out_h, lse_h = ctx.saved_tensors
        group = ctx.group
        dout_h = _sequence_to_heads(dout.contiguous(), group)
        dq_h, dk_h, dv_h = ctx.ops.backward(dout_h, qh, kh, vh, out_h, lse_h, ctx.causal, ctx.softmax_scale,
                                            deterministic=ctx.deterministic)
        dq, dk, dv = (_heads_to_sequence(x, group) for x in (dq_h, dk_h, dv_h))
        if ctx.kv_repeat > 1:  # the repeated heads' gradients sum into their source
            dk = dk.unflatten(2, (-1, ctx.kv_repeat)).sum(3)
            dv = dv.unflatten(2, (-1, ctx.kv_repeat)).sum(3)
        return dq, dk, dv, None, None, None, None, None


def ulysses_flash_attn_func(q, k, v, softmax_scale: Optional[float] = None, causal: bool = False,
                            group=None, block_ops: Optional[BlockOps] = None, deterministic: bool = False):
    """ring_flash_attn_func's contract with contiguous shards (rank r holds rows r x rows ..),
    by all-to-all: heads must divide by the group's size (kv heads are repeated up to a
    multiple of it). Differentiable in q, k, v."""
    world = dist.get_world_size(group)
    if q.shape[2] % world != 0:
        raise ValueError(f"ulysses_flash_attn_func: heads ({q.shape[2]}) must be a multiple of the group's "
                         f"size ({world}); ring_flash_attn_func takes any")
    if q.shape[2] % k.shape[2] != 0:
        raise ValueError(f"ulysses_flash_attn_func: heads ({q.shape[2]}) must be a multiple of kv heads "
                         f"({k.shape[2]})")
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _UlyssesAttention.apply(q, k, v, scale, bool(causal), group, block_ops or flashlab_block_ops,
                                   bool(deterministic))
