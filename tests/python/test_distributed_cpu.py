"""flashlab.distributed's ring and Ulysses attention on CPUs (issue 34's first tests): 2 and 4
processes on the gloo backend, the block operation replaced by plain torch math
(reference_block_ops, float64), against single-process attention of the whole
sequence (attention_reference.py): out, lse and the gradients of q, k, v, causal with
the zigzag layout and not, MHA and GQA. Also the zigzag layout's round trip and the
LSE merge against attention over the union of two key sets."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashlab import distributed
from flashlab.distributed import (
    BlockOps,
    merge_partial,
    reference_block_ops,
    ring_flash_attn_func,
    ring_flash_attn_varlen_func,
    ulysses_flash_attn_func,
    zigzag_shard,
    zigzag_shard_varlen,
    zigzag_unshard,
    zigzag_unshard_varlen,
)
from attention_reference import attention_ref, varlen_attention_ref

BATCH, HEADS, HEAD_DIM = 2, 4, 16


# The ring takes zigzag shards for causal attention; Ulysses (and the ring without a
# mask) contiguous ones.
def _zigzag(scheme, causal):
    return scheme == "ring" and causal


def _shard(x, rank, world, zigzag):
    return zigzag_shard(x, rank, world) if zigzag else x.chunk(world, dim=1)[rank]


def _unshard(shards, zigzag, dim=1):
    return zigzag_unshard(shards, dim=dim) if zigzag else torch.cat(shards, dim=dim)


def _problem(seqlen, kv_heads):
    generator = torch.Generator().manual_seed(1234)
    normal = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    return (normal(BATCH, seqlen, HEADS, HEAD_DIM), normal(BATCH, seqlen, kv_heads, HEAD_DIM),
            normal(BATCH, seqlen, kv_heads, HEAD_DIM), normal(BATCH, seqlen, HEADS, HEAD_DIM))


def _worker(rank, world, init_file, seqlen, kv_heads, causal, scheme, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        q, k, v, dout = _problem(seqlen, kv_heads)
        zigzag = _zigzag(scheme, causal)
        local = [_shard(x, rank, world, zigzag).clone().requires_grad_() for x in (q, k, v)]
        if scheme == "ring":
            out, lse = ring_flash_attn_func(*local, causal=causal, block_ops=reference_block_ops, return_lse=True)
        else:
            out, lse = ulysses_flash_attn_func(*local, causal=causal, block_ops=reference_block_ops), None
        out.backward(_shard(dout, rank, world, zigzag))
        torch.save({"out": out.detach(), "lse": lse, "dq": local[0].grad, "dk": local[1].grad,
                    "dv": local[2].grad}, os.path.join(results, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("scheme,world,seqlen,kv_heads,causal", [
    ("ring", 2, 28, 4, False),     # MHA, not causal, contiguous shards of 14 rows
    ("ring", 2, 36, 2, True),      # GQA, causal zigzag: chunks of 9 rows
    ("ring", 4, 40, 1, True),      # MQA, causal zigzag over four ranks: chunks of 5 rows
    ("ring", 4, 44, 2, False),
    ("ulysses", 2, 30, 2, True),   # 4 heads, 2 kv heads over 2 ranks
    ("ulysses", 4, 28, 1, False),  # MQA: the kv head repeated to 4
])
def test_distributed_attention_matches_single_process_attention(scheme, world, seqlen, kv_heads, causal):
    with tempfile.TemporaryDirectory() as results:
        init_file = os.path.join(results, "init")
        mp.spawn(_worker, args=(world, init_file, seqlen, kv_heads, causal, scheme, results), nprocs=world,
                 join=True)
        shards = [torch.load(os.path.join(results, f"{rank}.pt")) for rank in range(world)]
    q, k, v, dout = _problem(seqlen, kv_heads)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = attention_ref(*leaves, causal=causal)
    grads = torch.autograd.grad(out, leaves, dout)
    zigzag = _zigzag(scheme, causal)
    gathered = {name: _unshard([s[name] for s in shards], zigzag) for name in ("out", "dq", "dk", "dv")}
    expected = {"out": out, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    if scheme == "ring":  # (batch, heads, rows): the sequence is dim 2
        gathered["lse"] = _unshard([s["lse"] for s in shards], zigzag, dim=2)
        expected["lse"] = lse
    for name, want in expected.items():
        error = (gathered[name].double() - want.double()).abs().max().item()
        bound = 1e-5 if name == "lse" else 1e-9  # attention_ref's lse is float32
        assert error < bound, f"{name}: max error {error:.3e} against single-process attention"


def _run_scenario(rank, world, init_file, results, scenario):
    """scenario(rank, world) in a gloo group of `world` processes; saves what it returns."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(scenario(rank, world), os.path.join(results, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _spawn(world, scenario):
    """Each rank's record of scenario, in rank order."""
    with tempfile.TemporaryDirectory() as results:
        mp.spawn(_run_scenario, args=(world, os.path.join(results, "init"), results, scenario), nprocs=world,
                 join=True)
        return [torch.load(os.path.join(results, f"{rank}.pt")) for rank in range(world)]


def _deterministic_flags(rank, world):
    """The deterministic flag each block backward got, ring then Ulysses."""
    flags = []

    def recording_backward(*args, deterministic=False, **kwargs):
        flags.append(deterministic)
        return reference_block_ops.backward(*args, deterministic=deterministic, **kwargs)
    ops = BlockOps(reference_block_ops.forward, recording_backward)
    q, k, v, dout = _problem(24, 2)
    for function in (ring_flash_attn_func, ulysses_flash_attn_func):
        local = [x.chunk(world, dim=1)[rank].clone().requires_grad_() for x in (q, k, v)]
        function(*local, block_ops=ops, deterministic=True).backward(dout.chunk(world, dim=1)[rank])
    return flags


def test_deterministic_reaches_every_block_backward():
    world = 2
    flags = _spawn(world, _deterministic_flags)
    # The ring: one block backward a step (world steps); Ulysses: one.
    assert all(f == [True] * (world + 1) for f in flags), flags


def _forward_margins(rank, world):
    """The sm_margin each block forward got: the ring with sm_margin=6, then with its default."""
    margins = []

    def recording_forward(*args, sm_margin=0, **kwargs):
        margins.append(sm_margin)
        return reference_block_ops.forward(*args, **kwargs)
    ops = BlockOps(recording_forward, reference_block_ops.backward)
    q, k, v, _ = _problem(24, 2)
    local = [x.chunk(world, dim=1)[rank] for x in (q, k, v)]
    ring_flash_attn_func(*local, block_ops=ops, sm_margin=6)
    ring_flash_attn_func(*local, block_ops=ops)  # the default: 0 for block ops other than flashlab's
    return margins


def test_sm_margin_reaches_the_forwards_beside_a_transfer():
    world = 3
    margins = _spawn(world, _forward_margins)
    # Steps 0 .. world - 2 send K/V on while they compute; the last one sends nothing.
    assert all(m == [6] * (world - 1) + [0] + [0] * world for m in margins), margins
    assert distributed._sm_margin(None, distributed.flashlab_block_ops) == distributed.DEFAULT_RING_SM_MARGIN > 0
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="sm_margin .* must be an int >= 0 or None; got -1"):
        ring_flash_attn_func(q, q, q, sm_margin=-1)


def test_zigzag_round_trip_and_balance():
    x = torch.arange(2 * 3 * 24).reshape(2, 24, 3, 1)
    shards = [zigzag_shard(x, rank, 3) for rank in range(3)]
    assert torch.equal(zigzag_unshard(shards), x)
    # rank r holds chunks r and 2w-1-r of 4 rows: positions 4r.. and 4(5-r)..
    assert shards[0][0, :, 0, 0].tolist()[:4] == [0, 3, 6, 9]
    with pytest.raises(ValueError, match="multiple of 2 x world_size = 6"):
        zigzag_shard(x[:, :20], 0, 3)


def test_merge_partial_is_attention_over_the_union():
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 5, 2, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    whole, whole_lse = attention_ref(q, k, v)
    first, first_lse = attention_ref(q, k[:, :2], v[:, :2])
    second, second_lse = attention_ref(q, k[:, 2:], v[:, 2:])
    merged, merged_lse = merge_partial(first, first_lse.double(), second, second_lse.double())
    # attention_ref's lse is float32: its rounding bounds the agreement.
    assert (merged - whole).abs().max().item() < 1e-6
    assert (merged_lse - whole_lse.double()).abs().max().item() < 1e-6
    # A side that saw no key (lse -inf) leaves the other as it was; both empty: 0 and -inf.
    empty = torch.full_like(first_lse.double(), float("-inf"))
    kept, kept_lse = merge_partial(torch.zeros_like(first), empty, first, first_lse.double())
    assert torch.equal(kept, first) and torch.equal(kept_lse, first_lse.double())
    none, none_lse = merge_partial(torch.zeros_like(first), empty, torch.zeros_like(first), empty)
    assert torch.equal(none, torch.zeros_like(first)) and torch.isneginf(none_lse).all()


def _varlen_problem(lengths, kv_heads):
    generator = torch.Generator().manual_seed(99)
    total = sum(lengths)
    normal = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)  # noqa: E731
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return (normal(total, HEADS, HEAD_DIM), normal(total, kv_heads, HEAD_DIM), normal(total, kv_heads, HEAD_DIM),
            normal(total, HEADS, HEAD_DIM), cu)


def _varlen_worker(rank, world, init_file, lengths, kv_heads, causal, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        q, k, v, dout, cu = _varlen_problem(lengths, kv_heads)
        local = []
        for x in (q, k, v):
            rows, cu_local, max_local = zigzag_shard_varlen(x, cu, rank, world)
            local.append(rows.clone().requires_grad_())
        out, lse = ring_flash_attn_varlen_func(*local, cu_local, max_local, causal=causal,
                                               block_ops=reference_block_ops, return_lse=True)
        out.backward(zigzag_shard_varlen(dout, cu, rank, world)[0])
        torch.save({"out": out.detach(), "lse": lse, "dq": local[0].grad, "dk": local[1].grad,
                    "dv": local[2].grad}, os.path.join(results, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,lengths,kv_heads,causal", [
    (2, [8, 12, 4], 2, True),
    (4, [16, 8, 24], 1, True),
    (2, [12, 4, 20], 4, False),
])
def test_ring_varlen_matches_single_process_attention(world, lengths, kv_heads, causal):
    with tempfile.TemporaryDirectory() as results:
        mp.spawn(_varlen_worker, args=(world, os.path.join(results, "init"), lengths, kv_heads, causal, results),
                 nprocs=world, join=True)
        shards = [torch.load(os.path.join(results, f"{rank}.pt")) for rank in range(world)]
    q, k, v, dout, cu = _varlen_problem(lengths, kv_heads)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = varlen_attention_ref(*leaves, cu, cu, causal=causal)
    grads = torch.autograd.grad(out, leaves, dout)
    gathered = {name: zigzag_unshard_varlen([s[name] for s in shards], cu) for name in ("out", "dq", "dk", "dv")}
    # lse (heads, rows): unshard along the rows as packed (rows, heads).
    gathered["lse"] = zigzag_unshard_varlen([s["lse"].transpose(0, 1) for s in shards], cu).transpose(0, 1)
    expected = {"out": out, "lse": lse, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
    for name, want in expected.items():
        error = (gathered[name].double() - want.double()).abs().max().item()
        bound = 1e-5 if name == "lse" else 1e-9
        assert error < bound, f"{name}: max error {error:.3e} against single-process attention"
