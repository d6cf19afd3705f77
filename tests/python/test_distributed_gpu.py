"""flashlab.distributed on GPUs (marker gpu): ring (zigzag for causal) and Ulysses
attention with flashlab's kernels per block, on every GPU of the machine (2 to 4 ranks,
NCCL), against the same attention of the whole sequence: out and the gradients within
flash-attn's rule (attention_reference.py: 2x / 3x PyTorch's error in the input dtype
against float32). Skipped with fewer than two GPUs. With deterministic=True three runs give bitwise equal
gradients. All 20 pass on 4 H100s (session 25, torch 2.11, NCCL 2.28.9)."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flashlab.distributed import (ring_flash_attn_func, ring_flash_attn_varlen_func, ulysses_flash_attn_func,
                                  zigzag_shard, zigzag_shard_varlen, zigzag_unshard, zigzag_unshard_varlen)
from attention_reference import assert_close_to_reference, attention_ref, varlen_attention_ref

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2 or not dist.is_nccl_available(),
                                 reason="needs two or more CUDA devices and NCCL")]

BATCH, HEADS, HEAD_DIM = 2, 8, 128
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _problem(seqlen, kv_heads, dtype=torch.bfloat16):
    generator = torch.Generator().manual_seed(2024)
    normal = lambda *shape: torch.randn(*shape, generator=generator).to(dtype)  # noqa: E731
    return (normal(BATCH, seqlen, HEADS, HEAD_DIM), normal(BATCH, seqlen, kv_heads, HEAD_DIM),
            normal(BATCH, seqlen, kv_heads, HEAD_DIM), normal(BATCH, seqlen, HEADS, HEAD_DIM))


def _worker(rank, world, init_file, seqlen, kv_heads, causal, scheme, results, deterministic=False, runs=1,
            dtype=torch.bfloat16):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        zigzag = scheme == "ring" and causal
        shard = (lambda x: zigzag_shard(x, rank, world)) if zigzag else (lambda x: x.chunk(world, dim=1)[rank])
        q, k, v, dout = (shard(x).cuda() for x in _problem(seqlen, kv_heads, dtype))
        attention = ring_flash_attn_func if scheme == "ring" else ulysses_flash_attn_func
        saved = []
        for _ in range(runs):
            local = [x.clone().requires_grad_() for x in (q, k, v)]
            out = attention(*local, causal=causal, deterministic=deterministic)
            out.backward(dout)
            saved.append({name: t.detach().cpu() for name, t in
                          (("out", out), ("dq", local[0].grad), ("dk", local[1].grad), ("dv", local[2].grad))})
        torch.save(saved[0] if runs == 1 else saved, os.path.join(results, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("world", [w for w in (2, 4) if w <= torch.cuda.device_count()])
@pytest.mark.parametrize("scheme,seqlen,kv_heads,causal", [
    ("ring", 4096, 8, False), ("ring", 4096, 2, True), ("ulysses", 4096, 8, True), ("ulysses", 2048, 8, False)])
def test_distributed_matches_one_gpu(scheme, seqlen, kv_heads, causal, world, dtype):
    DTYPE = DTYPES[dtype]
    with tempfile.TemporaryDirectory() as results:
        mp.spawn(_worker, args=(world, os.path.join(results, "init"), seqlen, kv_heads, causal, scheme, results,
                                False, 1, DTYPE), nprocs=world, join=True)
        shards = [torch.load(os.path.join(results, f"{rank}.pt")) for rank in range(world)]
    zigzag = scheme == "ring" and causal
    gathered = {name: (zigzag_unshard if zigzag else lambda s: torch.cat(s, dim=1))([s[name] for s in shards])
                for name in ("out", "dq", "dk", "dv")}
    q, k, v, dout = (x.cuda() for x in _problem(seqlen, kv_heads, DTYPE))
    precise = [x.float().requires_grad_() for x in (q, k, v)]
    same = [x.clone().requires_grad_() for x in (q, k, v)]
    out_precise, _ = attention_ref(*precise, causal=causal)
    out_same, _ = attention_ref(*same, causal=causal)
    assert_close_to_reference("out", gathered["out"].cuda(), out_precise, out_same, 2, DTYPE)
    grads_precise = torch.autograd.grad(out_precise, precise, dout.float())
    grads_same = torch.autograd.grad(out_same, same, dout)
    for name, grad_precise, grad_same in zip(("dq", "dk", "dv"), grads_precise, grads_same):
        assert_close_to_reference(name, gathered[name].cuda(), grad_precise, grad_same, 3, DTYPE)


@pytest.mark.parametrize("scheme", ["ring", "ulysses"])
def test_deterministic_gradients_are_bitwise_reproducible(scheme):
    world = min(torch.cuda.device_count(), 4)
    with tempfile.TemporaryDirectory() as results:
        mp.spawn(_worker, args=(world, os.path.join(results, "init"), 2048, 2, True, scheme, results, True, 3),
                 nprocs=world, join=True)
        for rank in range(world):
            runs = torch.load(os.path.join(results, f"{rank}.pt"))
            for later in runs[1:]:
                for name in ("out", "dq", "dk", "dv"):
                    assert torch.equal(later[name], runs[0][name]), f"rank {rank}: {name} differs between runs"


def _varlen_worker(rank, world, init_file, lengths, kv_heads, causal, results):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        q, k, v, dout, cu = (x.cuda() for x in _varlen_problem(lengths, kv_heads))
        local = []
        for x in (q, k, v):
            rows, cu_local, max_local = zigzag_shard_varlen(x, cu, rank, world)
            local.append(rows.clone().requires_grad_())
        out = ring_flash_attn_varlen_func(*local, cu_local, max_local, causal=causal)
        out.backward(zigzag_shard_varlen(dout, cu, rank, world)[0])
        torch.save({name: t.detach().cpu() for name, t in
                    (("out", out), ("dq", local[0].grad), ("dk", local[1].grad), ("dv", local[2].grad))},
                   os.path.join(results, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _varlen_problem(lengths, kv_heads):
    generator = torch.Generator().manual_seed(77)
    total = sum(lengths)
    normal = lambda *shape: torch.randn(*shape, generator=generator).to(torch.bfloat16)  # noqa: E731
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return (normal(total, HEADS, HEAD_DIM), normal(total, kv_heads, HEAD_DIM), normal(total, kv_heads, HEAD_DIM),
            normal(total, HEADS, HEAD_DIM), cu)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_varlen_matches_one_gpu(causal):
    world = min(torch.cuda.device_count(), 4)
    lengths = [2 * world * n for n in (9, 130, 41)]  # every sequence splits into 2 x world chunks
    with tempfile.TemporaryDirectory() as results:
        mp.spawn(_varlen_worker, args=(world, os.path.join(results, "init"), lengths, 2, causal, results),
                 nprocs=world, join=True)
        shards = [torch.load(os.path.join(results, f"{rank}.pt")) for rank in range(world)]
    q, k, v, dout, cu = (x.cuda() for x in _varlen_problem(lengths, 2))
    gathered = {name: zigzag_unshard_varlen([s[name] for s in shards], cu) for name in ("out", "dq", "dk", "dv")}
    precise = [x.float().requires_grad_() for x in (q, k, v)]
    same = [x.clone().requires_grad_() for x in (q, k, v)]
    out_precise, _ = varlen_attention_ref(*precise, cu, cu, causal=causal)
    out_same, _ = varlen_attention_ref(*same, cu, cu, causal=causal)
    assert_close_to_reference("out", gathered["out"].cuda(), out_precise, out_same, 2, torch.bfloat16)
    grads_precise = torch.autograd.grad(out_precise, precise, dout.float())
    grads_same = torch.autograd.grad(out_same, same, dout)
    for name, grad_precise, grad_same in zip(("dq", "dk", "dv"), grads_precise, grads_same):
        assert_close_to_reference(name, gathered[name].cuda(), grad_precise, grad_same, 3, torch.bfloat16)
