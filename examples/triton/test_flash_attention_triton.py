"""Tests of examples/triton/flash_attention_triton.py against a float64 reference.

With a CUDA device the kernels run on it; without one this file sets
TRITON_INTERPRET=1 before importing triton, so the same kernels run on the CPU
in Triton's interpreter (which needs numpy). The whole file takes seconds
there: the problems are small.

    .venv/bin/python -m pytest -q examples/triton/test_flash_attention_triton.py
"""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from triton_setup import DEVICE, ON_GPU, require_triton  # noqa: E402

require_triton()
from flash_attention_triton import attention, attention_planted_bug  # noqa: E402

OUT_TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LSE_TOL = 1e-4


# --------------------------------------------------------------------------- reference

def reference_scores(q, k, causal, softmax_scale=None):
    """float64 scores (batch, heads, seqlen_q, seqlen_k), -inf where masked."""
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    q64 = q.detach().to("cpu", torch.float64).transpose(1, 2)
    k64 = k.detach().to("cpu", torch.float64).repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    if causal:
        # Bottom-right aligned: row i sees key j iff j <= i + seqlen_k - seqlen_q.
        rows = torch.arange(seqlen_q)[:, None]
        keys = torch.arange(seqlen_k)[None, :]
        scores = scores.masked_fill(keys > rows + (seqlen_k - seqlen_q), float("-inf"))
    return scores


def reference_attention(q, k, v, causal, softmax_scale=None):
    """float64 (out (batch, seqlen_q, heads, head_dim), lse (batch, heads, seqlen_q));
    a row that sees no key gets out 0 and lse -inf."""
    heads, kv_heads = q.shape[2], k.shape[2]
    scores = reference_scores(q, k, causal, softmax_scale)
    lse = torch.logsumexp(scores, dim=-1)  # -inf for a fully masked row
    empty = torch.isneginf(lse)
    probs = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])  # exp(-inf) = 0 there
    v64 = v.detach().to("cpu", torch.float64).repeat_interleave(heads // kv_heads, dim=2).transpose(1, 2)
    out = (probs @ v64).transpose(1, 2)
    return out, lse


def make_inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32).to(DEVICE, dtype)
    return (randn(batch, seqlen_q, heads, head_dim),
            randn(batch, seqlen_k, kv_heads, head_dim),
            randn(batch, seqlen_k, kv_heads, head_dim))


@pytest.fixture
def poisoned_empty(monkeypatch):
    """torch.empty returns NaN-filled (float) memory while the test runs, so an
    element the kernel fails to write shows up as NaN."""
    real_empty = torch.empty
    def empty(*args, **kwargs):
        tensor = real_empty(*args, **kwargs)
        if tensor.is_floating_point():
            tensor.fill_(float("nan"))
        return tensor
    monkeypatch.setattr(torch, "empty", empty)


def check_against_reference(out, lse, q, k, v, causal, softmax_scale=None):
    ref_out, ref_lse = reference_attention(q, k, v, causal, softmax_scale)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1]) and lse.dtype == torch.float32
    out64 = out.to("cpu", torch.float64)
    lse64 = lse.to("cpu", torch.float64)
    assert not torch.isnan(out64).any(), "NaN in out (unwritten element or 0/0)"
    assert not torch.isnan(lse64).any(), "NaN in lse"
    # Rows that see no key: exactly 0 and -inf.
    empty = torch.isneginf(ref_lse)  # (batch, heads, seqlen_q)
    assert torch.equal(torch.isneginf(lse64), empty)
    assert (out64.transpose(1, 2)[empty] == 0).all()
    seen = ~empty
    out_err = (out64 - ref_out).abs().max().item() if out.numel() else 0.0
    lse_err = (lse64[seen] - ref_lse[seen]).abs().max().item() if seen.any() else 0.0
    assert out_err <= OUT_TOL[q.dtype], f"out max abs error {out_err:.3g}"
    assert lse_err <= LSE_TOL, f"lse max abs error {lse_err:.3g}"


# --------------------------------------------------------------------------- attention

# (batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, causal)
CASES = [
    (1, 7, 113, 4, 2, 64, False),      # GQA, query shorter than keys, ragged last key tile
    (2, 113, 113, 2, 1, 64, True),     # MQA, causal square
    (1, 130, 70, 2, 2, 128, True),     # causal, seqlen_q > seqlen_k: rows 0..59 see no key
    (1, 70, 130, 2, 1, 128, False),
    (1, 1, 1, 1, 1, 64, False),
    (1, 1, 113, 2, 2, 64, True),       # the one row sees every key
    (1, 113, 1, 2, 1, 64, True),       # only the last row sees a key
    (1, 1023, 1023, 1, 1, 64, True),   # 16 x 16 tiles, causal early exit
    (1, 5, 1023, 2, 1, 64, False),
    (2, 33, 47, 4, 4, 16, True),
    (1, 20, 29, 2, 1, 32, False),
    (1, 19, 70, 1, 1, 256, True),
]


def case_id(case):
    b, sq, sk, h, kvh, d, causal = case
    return f"b{b}-q{sq}-k{sk}-h{h}-kv{kvh}-d{d}" + ("-causal" if causal else "")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_attention_fp32(case, poisoned_empty):
    batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, causal = case
    q, k, v = make_inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, torch.float32)
    out, lse = attention(q, k, v, causal=causal)
    check_against_reference(out, lse, q, k, v, causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", CASES[:4], ids=case_id)
def test_attention_16bit(case, dtype, poisoned_empty):
    if dtype == torch.bfloat16 and not ON_GPU:
        # Triton 3.8's interpreter keeps bf16 as raw uint16 bits and its tl.dot
        # multiplies those bits as integers.
        pytest.skip("bf16 tl.dot is wrong in Triton's CPU interpreter; runs on a GPU")
    batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, causal = case
    q, k, v = make_inputs(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, dtype)
    out, lse = attention(q, k, v, causal=causal)
    check_against_reference(out, lse, q, k, v, causal)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 64), (64, 16), (128, 32)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_tile_sizes(block_m, block_n, causal, poisoned_empty):
    q, k, v = make_inputs(1, 77, 50, 2, 1, 32, torch.float32, seed=1)
    out, lse = attention(q, k, v, causal=causal, block_m=block_m, block_n=block_n)
    check_against_reference(out, lse, q, k, v, causal)


def test_attention_strided_inputs_and_scale(poisoned_empty):
    # q, k, v as views of one packed (batch, seqlen, 3, heads, head_dim) tensor.
    generator = torch.Generator().manual_seed(2)
    qkv = torch.randn(2, 45, 3, 2, 64, generator=generator).to(DEVICE)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert not q.is_contiguous()
    out, lse = attention(q, k, v, causal=True, softmax_scale=0.3)
    check_against_reference(out, lse, q, k, v, True, softmax_scale=0.3)


def test_attention_rejects_bad_inputs():
    q, k, v = make_inputs(1, 8, 8, 4, 2, 64, torch.float32)
    with pytest.raises(ValueError):
        attention(q, k[:, :, :1].expand(1, 8, 3, 64), v[:, :, :1].expand(1, 8, 3, 64))  # 4 % 3
    with pytest.raises(ValueError):
        attention(q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v)  # last stride != 1
    with pytest.raises(ValueError):
        attention(q[..., :48], k[..., :48], v[..., :48])  # head_dim 48
    with pytest.raises(ValueError):
        attention(q, k, v, block_n=48)


# --------------------------------------------------------------------------- planted bug

BLOCK_N = 64


def bad_rows(out, ref_out, tol):
    """(heads, seqlen_q) bool: rows of batch 0 whose output departs beyond tol."""
    error = (out.to("cpu", torch.float64) - ref_out).abs()[0]  # (seqlen_q, heads, head_dim)
    return (error.amax(dim=-1) > tol).transpose(0, 1)


def first_bad(bad):
    """The (head, row) with the smallest row (then head) among bad, or None."""
    pairs = bad.transpose(0, 1).nonzero()  # sorted by row, then head
    return None if len(pairs) == 0 else (pairs[0, 1].item(), pairs[0, 0].item())


def test_planted_bug_causal_first_bad_row_peaks_in_key_tile_1():
    # Causal square, 200 keys: rows 0..63 see only key tile 0, rows 64..127
    # see tiles 0 and 1, so there the bug hits exactly the rows whose maximum
    # score lies in tile 1 (keys 64..127).
    q, k, v = make_inputs(1, 200, 200, 2, 1, 64, torch.float32, seed=3)
    out, lse = attention_planted_bug(q, k, v, causal=True, block_n=BLOCK_N)
    ref_out, _ = reference_attention(q, k, v, causal=True)
    assert torch.isfinite(out).all()

    bad = bad_rows(out, ref_out, OUT_TOL[torch.float32])
    assert bad.any(), "the planted bug changed no row"
    scores = reference_scores(q, k, causal=True)[0]  # (heads, seqlen_q, seqlen_k)
    peak_key = scores.argmax(dim=-1)                    # where each row's maximum lies
    peak_tile = peak_key // BLOCK_N

    head, row = first_bad(bad)
    assert BLOCK_N <= row < 2 * BLOCK_N, f"first bad row {row}"
    assert peak_tile[head, row] == 1, (
        f"first bad row {row} (head {head}) has its maximum at key {peak_key[head, row].item()}")
    assert not bad[:, :BLOCK_N].any(), "rows that see only key tile 0 changed"
    window = slice(BLOCK_N, 2 * BLOCK_N)
    assert not (bad[:, window] & (peak_tile[:, window] != 1)).any(), \
        "a row of 64..127 whose maximum is not in tile 1 changed"
    # Every bad row anywhere had its running maximum raised in tile 1.
    prefix_peak_tile = scores[..., : 2 * BLOCK_N].argmax(dim=-1) // BLOCK_N
    assert not (bad & (prefix_peak_tile == 0)).any()


def test_planted_bug_full_rows_wrong_only_where_max_moves_in_tile_1():
    q, k, v = make_inputs(1, 37, 200, 2, 2, 64, torch.float32, seed=4)
    out, _ = attention_planted_bug(q, k, v, block_n=BLOCK_N)
    ref_out, _ = reference_attention(q, k, v, causal=False)
    assert torch.isfinite(out).all()

    bad = bad_rows(out, ref_out, OUT_TOL[torch.float32])
    assert bad.any()
    scores = reference_scores(q, k, causal=False)[0]
    # Where the running maximum stands after key tiles 0 and 1.
    prefix_peak_tile = scores[..., : 2 * BLOCK_N].argmax(dim=-1) // BLOCK_N
    head, row = first_bad(bad)
    assert prefix_peak_tile[head, row] == 1
    assert not (bad & (prefix_peak_tile == 0)).any(), \
        "a row whose maximum stayed in key tile 0 changed"
    # Every row whose overall maximum lies in tile 1 is hit.
    peak_tile = scores.argmax(dim=-1) // BLOCK_N
    assert bad[peak_tile == 1].all()


@pytest.mark.parametrize("seqlen_k,block_n,causal", [
    (64, 64, False), (50, 64, False), (64, 64, True), (200, 256, False)],
    ids=["k64-n64", "k50-n64", "k64-n64-causal", "k200-n256"])
def test_planted_bug_invisible_with_one_key_tile(seqlen_k, block_n, causal, poisoned_empty):
    # With seqlen_k <= block_n there is no key tile 1: the buggy entry is exact.
    q, k, v = make_inputs(1, 113, seqlen_k, 2, 1, 64, torch.float32, seed=5)
    out, lse = attention_planted_bug(q, k, v, causal=causal, block_n=block_n)
    check_against_reference(out, lse, q, k, v, causal)
