"""The GPU suite of the Python package (marker gpu; skipped without a CUDA device).

On the pattern of flash-attn's test_flash_attn_output / test_flash_attn_varlen_output:
random q, k, v and an upstream gradient, flashlab's out, lse, dq, dk, dv against a
precise PyTorch reference (float32; float64 for float32 inputs), each within
2x (out, lse) or 3x (gradients) the error of the same PyTorch attention computed
in the input dtype, plus flash-attn's rounding atol (attention_reference.py).

Two sizes (case counts printed by `pytest --collect-only -q -m gpu`):
  default        a representative subset: every dtype x head dim, each seqlen
                 pair, causal, local, MHA/MQA/GQA and deterministic cycling over them
  FLASHLAB_FULL_MATRIX=1   the full products (output and varlen matrices), as flash-attn's
"""
import itertools
import random
import zlib

import pytest
import torch

import flashlab
from flashlab import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_with_kvcache,
)
from attention_reference import (
    assert_close_to_reference,
    attention_ref,
    reference_dtype,
    sink_gradient_stored_output_term,
    varlen_attention_ref,
)
from conftest import FULL_MATRIX, requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]

DTYPES = [torch.float16, torch.bfloat16]
DTYPE_IDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
HEAD_DIMS = [32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256]
SEQLENS = [(113, 203), (128, 217), (113, 211), (108, 256), (256, 512), (512, 256), (1024, 1024),
           (1023, 1024), (1024, 1023), (2048, 2048)]
VARLEN_SEQLENS = SEQLENS + [(1, 147)]
MHA_TYPES = ["mha", "mqa", "gqa"]
HEADS = 6
KV_HEADS = {"mha": 6, "gqa": 2, "mqa": 1}
DEVICE = "cuda"


def case_id(dtype, head_dim, seqlens, causal, local, mha_type, deterministic):
    return (f"{DTYPE_IDS[dtype]}-d{head_dim}-{seqlens[0]}x{seqlens[1]}-"
            f"{'causal' if causal else 'full'}-{'local' if local else 'global'}-{mha_type}"
            f"{'-det' if deterministic else ''}")


def output_cases(seqlen_pairs, per_head_dim):
    """The full product, or the default subset: for each (dtype, head dim), per_head_dim
    cases whose seqlen pair, causal, local, MHA type and deterministic flag cycle, so that
    every value of every factor appears many times."""
    if FULL_MATRIX:
        product = itertools.product(DTYPES, HEAD_DIMS, seqlen_pairs, [False, True], [False, True],
                                    MHA_TYPES, [False, True])
        cases = list(product)
    else:
        cases = []
        for i, (dtype, head_dim) in enumerate(itertools.product(DTYPES, HEAD_DIMS)):
            for j in range(per_head_dim):
                n = i * per_head_dim + j
                cases.append((dtype, head_dim, seqlen_pairs[n % len(seqlen_pairs)], n % 2 == 1,
                              (n // 2) % 2 == 1, MHA_TYPES[n % 3], (n // 4) % 3 == 0))
    return [pytest.param(*case, id=case_id(*case)) for case in cases]


def seeded(*key):
    """A generator seeded from the case, so a failing case reruns alike."""
    seed = zlib.crc32(repr(key).encode())
    torch.manual_seed(seed)
    return random.Random(seed)


def random_window(rng, seqlen_k, causal):
    left, right = rng.randrange(0, seqlen_k), rng.randrange(0, seqlen_k)
    return (left, 0 if causal else right)


def leaf(tensor, dtype=None):
    return tensor.detach().to(dtype or tensor.dtype).requires_grad_()


def check_forward_backward(dtype, out, lse, inputs, reference, grads=None, dout=None):
    """out, lse: flashlab's. inputs: the leaves (q, k, v) flashlab saw. reference(q, k, v)
    -> (out, lse) in the leaves' dtype. Checks out and lse and, with dout, the gradients
    grads = (dq, dk, dv)."""
    precise_inputs = [leaf(x, reference_dtype(dtype)) for x in inputs]
    same_inputs = [leaf(x) for x in inputs]
    out_ref, lse_ref = reference(*precise_inputs)
    out_pt, lse_pt = reference(*same_inputs)
    assert_close_to_reference("out", out, out_ref, out_pt, 2, dtype)
    assert_close_to_reference("lse", lse, lse_ref, lse_pt, 2, dtype)
    if dout is None:
        return
    grads_ref = torch.autograd.grad(out_ref, precise_inputs, dout.to(out_ref.dtype))
    grads_pt = torch.autograd.grad(out_pt, same_inputs, dout)
    for name, grad, grad_ref, grad_pt in zip(("dq", "dk", "dv", "dsinks"), grads, grads_ref, grads_pt):
        stored_output_term = (sink_gradient_stored_output_term(out_ref, lse_ref, dout, inputs[3], dtype)
                              if name == "dsinks" else 0.0)
        assert_close_to_reference(name, grad, grad_ref, grad_pt, 3, dtype, stored_output_term)


# ---------------------------------------------------------------------------
# flash_attn_func: forward and backward against the reference


@pytest.mark.parametrize("dtype,head_dim,seqlens,causal,local,mha_type,deterministic",
                         output_cases(SEQLENS, per_head_dim=4))
def test_flash_attn_output(dtype, head_dim, seqlens, causal, local, mha_type, deterministic):
    rng = seeded("output", dtype, head_dim, seqlens, causal, local, mha_type, deterministic)
    seqlen_q, seqlen_k = seqlens
    batch = 2 if seqlen_q * seqlen_k <= 1024 * 1024 else 1
    window = random_window(rng, seqlen_k, causal) if local else (-1, -1)
    q = torch.randn(batch, seqlen_q, HEADS, head_dim, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, seqlen_k, KV_HEADS[mha_type], head_dim, device=DEVICE, dtype=dtype,
                    requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out, lse, probs = flash_attn_func(q, k, v, causal=causal, window_size=window,
                                      deterministic=deterministic, return_attn_probs=True)
    assert probs.numel() == 0 and out.shape == q.shape and lse.shape == (batch, HEADS, seqlen_q)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=deterministic)
    check_forward_backward(dtype, out, lse, (q, k, v),
                           lambda q, k, v: attention_ref(q, k, v, causal=causal, window=window),
                           grads, dout)
    if deterministic:  # bitwise the same gradients on a second run
        again = torch.autograd.grad(out, (q, k, v), dout)
        for name, first, second in zip(("dq", "dk", "dv"), grads, again):
            assert torch.equal(first, second), f"{name} differs between two deterministic runs"


# ---------------------------------------------------------------------------
# flash_attn_varlen_func


def random_lengths(rng, batch, max_seqlen):
    return [rng.randint(max(1, max_seqlen - 20), max_seqlen) for _ in range(batch)]


def cumulative(lengths):
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return torch.tensor(offsets, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("dtype,head_dim,seqlens,causal,local,mha_type,deterministic",
                         output_cases(VARLEN_SEQLENS, per_head_dim=2))
def test_flash_attn_varlen_output(dtype, head_dim, seqlens, causal, local, mha_type, deterministic):
    rng = seeded("varlen", dtype, head_dim, seqlens, causal, local, mha_type, deterministic)
    max_q, max_k = seqlens
    batch = 3
    lengths_q, lengths_k = random_lengths(rng, batch, max_q), random_lengths(rng, batch, max_k)
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    window = random_window(rng, max_k, causal) if local else (-1, -1)
    q = torch.randn(sum(lengths_q), HEADS, head_dim, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(sum(lengths_k), KV_HEADS[mha_type], head_dim, device=DEVICE, dtype=dtype,
                    requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                         causal=causal, window_size=window,
                                         deterministic=deterministic, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (HEADS, q.shape[0])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout, retain_graph=deterministic)
    check_forward_backward(
        dtype, out, lse, (q, k, v),
        lambda q, k, v: varlen_attention_ref(q, k, v, cu_q, cu_k, causal=causal, window=window),
        grads, dout)
    if deterministic:
        again = torch.autograd.grad(out, (q, k, v), dout)
        for name, first, second in zip(("dq", "dk", "dv"), grads, again):
            assert torch.equal(first, second), f"{name} differs between two deterministic runs"


# ---------------------------------------------------------------------------
# Each registered kernel by name (kernel=...), including fa1_scalar in float32


def kernel_cases():
    """Every registered kernel in every dtype it takes, at head dims the public API runs on it
    (the registry's head dims, padding up to the next), both read from flashlab.kernels()."""
    dtypes_by_name = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    cases = []
    for name, info in flashlab.kernels().items():
        dtypes = [dtypes_by_name[d] for d in info.dtypes]
        head_dims = [d for d in (32, 59, 64, 128, 256) if info.runs_head_dim(d)]
        for dtype, head_dim, seqlens, causal in itertools.product(
                dtypes, head_dims, [(113, 203), (1024, 1023)], [False, True]):
            case = (name, dtype, head_dim, seqlens, causal)
            cases.append(pytest.param(*case, id=f"{name}-{DTYPE_IDS[dtype]}-d{head_dim}-"
                                                f"{seqlens[0]}x{seqlens[1]}-{'causal' if causal else 'full'}"))
    return cases


def run_or_skip_other_device(call):
    """Runs call(); a kernel whose code does not run on this GPU (fa3_wgmma_sm90 off
    compute capability 9.0) skips with the library's reason. Anything else raises."""
    try:
        return call()
    except RuntimeError as error:
        if "runs on compute capability" in str(error):
            pytest.skip(str(error).splitlines()[0])
        raise


@pytest.mark.parametrize("kernel,dtype,head_dim,seqlens,causal", kernel_cases())
def test_named_kernel(kernel, dtype, head_dim, seqlens, causal):
    seeded("kernel", kernel, dtype, head_dim, seqlens, causal)
    seqlen_q, seqlen_k = seqlens
    q = torch.randn(1, seqlen_q, 4, head_dim, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(1, seqlen_k, 2, head_dim, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    out, lse, _ = run_or_skip_other_device(
        lambda: flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, kernel=kernel))
    dout = torch.randn_like(out)
    # The backward: the kernel's own when it has one, else "auto".
    grads = torch.autograd.grad(out, (q, k, v), dout)
    check_forward_backward(dtype, out, lse, (q, k, v),
                           lambda q, k, v: attention_ref(q, k, v, causal=causal), grads, dout)


# ---------------------------------------------------------------------------
# Score modifications: softcap, ALiBi (per head, per batch entry), sinks (with
# their gradient), and all three, on every kernel, forward and backward.

MODIFICATIONS = {
    "softcap": dict(softcap=2.0),
    "alibi": dict(alibi="head"),
    "alibi_batch": dict(alibi="batch"),
    "sinks": dict(sinks=True),
    "all": dict(softcap=2.0, alibi="head", sinks=True),
}


def modification_cases():
    cases = []
    kernels = ["auto"] + [name for name in flashlab.kernels() if name != "fa3_wgmma_sm90"]
    for i, (name, kernel) in enumerate(itertools.product(MODIFICATIONS, kernels)):
        dtype, causal = DTYPES[i % 2], i % 3 != 0
        seqlens = [(113, 203), (203, 113), (1023, 1024)][i % 3]  # 203 x 113 causal: rows see no key
        head_dim = [64, 128, 59][(i // 3) % 3]
        case = (name, kernel, dtype, head_dim, seqlens, causal)
        cases.append(pytest.param(*case, id=f"{name}-{kernel}-{DTYPE_IDS[dtype]}-d{head_dim}-"
                                            f"{seqlens[0]}x{seqlens[1]}-{'causal' if causal else 'full'}"))
    return cases


def modification_inputs(name, batch, heads):
    """softcap, alibi_slopes (ALiBi's geometric slopes, per head or scaled per batch entry)
    and sinks (normal, a leaf) for a case of MODIFICATIONS."""
    spec = MODIFICATIONS[name]
    slopes = None
    if "alibi" in spec:
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=DEVICE)
        if spec["alibi"] == "batch":
            slopes = torch.outer(torch.arange(1, batch + 1, device=DEVICE) / batch, slopes).contiguous()
    sinks = torch.randn(heads, device=DEVICE, requires_grad=True) if spec.get("sinks") else None
    return spec.get("softcap", 0.0), slopes, sinks


@pytest.mark.parametrize("name,kernel,dtype,head_dim,seqlens,causal", modification_cases())
def test_score_modifications(name, kernel, dtype, head_dim, seqlens, causal):
    seeded("modification", name, kernel, dtype, head_dim, seqlens, causal)
    seqlen_q, seqlen_k = seqlens
    batch = 2
    q = torch.randn(batch, seqlen_q, HEADS, head_dim, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, seqlen_k, 2, head_dim, device=DEVICE, dtype=dtype, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    softcap, slopes, sinks = modification_inputs(name, batch, HEADS)
    out, lse, _ = run_or_skip_other_device(lambda: flash_attn_func(
        q, k, v, causal=causal, softcap=softcap, alibi_slopes=slopes, return_attn_probs=True,
        kernel=kernel, sinks=sinks))
    dout = torch.randn_like(out)
    leaves = (q, k, v) + ((sinks,) if sinks is not None else ())
    grads = torch.autograd.grad(out, leaves, dout)
    check_forward_backward(
        dtype, out, lse, leaves,
        lambda q, k, v, *sink: attention_ref(q, k, v, causal=causal, softcap=softcap, alibi_slopes=slopes,
                                             sinks=sink[0] if sink else None),
        grads, dout)


def test_score_modifications_varlen_and_kvcache():
    """The same definitions through flash_attn_varlen_func (a sequence without keys:
    its rows give 0 and lse = the sink) and flash_attn_with_kvcache (appending, split)."""
    seeded("modification varlen")
    lengths_q, lengths_k = [5, 0, 113, 64], [203, 7, 0, 64]
    cu_q = torch.tensor([0] + list(itertools.accumulate(lengths_q)), dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0] + list(itertools.accumulate(lengths_k)), dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(lengths_q), HEADS, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(sum(lengths_k), 2, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    softcap, slopes, sinks = modification_inputs("all", len(lengths_q), HEADS)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
                                         softcap=softcap, alibi_slopes=slopes, return_attn_probs=True,
                                         sinks=sinks)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, sinks), dout)
    check_forward_backward(
        torch.bfloat16, out, lse, (q, k, v, sinks),
        lambda q, k, v, s: varlen_attention_ref(q, k, v, cu_q, cu_k, causal=True, softcap=softcap,
                                                alibi_slopes=slopes, sinks=s),
        grads, dout)
    # Decoding: 2 new tokens appended to caches of 300 keys, forced into 3 splits.
    q = torch.randn(2, 2, HEADS, 128, device=DEVICE, dtype=torch.float16)
    k_cache = torch.randn(2, 512, 2, 128, device=DEVICE, dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    k_new, v_new = torch.randn(2, 2, 2, 128, device=DEVICE, dtype=torch.float16), \
        torch.randn(2, 2, 2, 128, device=DEVICE, dtype=torch.float16)
    seqlens = torch.tensor([300, 17], dtype=torch.int32, device=DEVICE)
    softcap, slopes, sinks = modification_inputs("all", 2, HEADS)
    sinks = sinks.detach()
    for splits in (1, 3):
        kc, vc = k_cache.clone(), v_cache.clone()
        out, lse = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens, causal=True,
                                           softcap=softcap, alibi_slopes=slopes, num_splits=splits,
                                           return_softmax_lse=True, sinks=sinks)
        for b in range(2):
            n = int(seqlens[b]) + 2
            qb, kb, vb = q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n]
            check_forward_backward(
                torch.float16, out[b:b + 1], lse[b:b + 1], (qb, kb, vb),
                lambda q, k, v: attention_ref(q, k, v, causal=True, softcap=softcap,
                                              alibi_slopes=slopes, sinks=sinks))


def test_softmax_scale_stays_that_of_the_original_head_dim():
    # head_dim 59 is padded to a kernel's 64; the default scale is 1/sqrt(59), and an
    # explicit one is used as given.
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 77, 2, 59, device=DEVICE, dtype=torch.bfloat16) for _ in range(3))
    for scale in (None, 0.05):
        out, lse, _ = flash_attn_func(q, k, v, softmax_scale=scale, return_attn_probs=True)
        check_forward_backward(
            torch.bfloat16, out, lse, (q, k, v),
            lambda q, k, v: attention_ref(q, k, v, softmax_scale=scale))


@pytest.mark.parametrize("causal", [False, True])
def test_sm_margin_leaves_the_result_unchanged(causal):
    # A smaller persistent grid hands the same tiles to fewer CTAs; each tile is
    # computed the same way, so the output is bitwise that of the full grid.
    torch.manual_seed(5)
    q = torch.randn(2, 1023, 8, 128, device=DEVICE, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1023, 2, 128, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    full = torch.ops.flashlab.fwd(q, k, v, None, causal, -1, -1, False, "auto")
    for margin in (7, 10_000):  # 10 000: more than the device has, the grid keeps one CTA
        out, lse = torch.ops.flashlab.fwd(q, k, v, None, causal, -1, -1, False, "auto", sm_margin=margin)
        assert torch.equal(out, full[0]) and torch.equal(lse, full[1]), margin
    with pytest.raises(RuntimeError, match="sm_margin .* must be >= 0; got -2"):
        torch.ops.flashlab.fwd(q, k, v, sm_margin=-2)


def test_packed_layouts_match_separate_tensors():
    torch.manual_seed(4)
    qkv = torch.randn(2, 200, 3, 4, 64, device=DEVICE, dtype=torch.float16, requires_grad=True)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    q, k, v = (leaf(x) for x in qkv.unbind(2))
    expected = flash_attn_func(q, k, v, causal=True)
    assert torch.equal(out, expected)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    dq, dk, dv = torch.autograd.grad(expected, (q, k, v), dout)
    assert torch.equal(dqkv, torch.stack((dq, dk, dv), dim=2))
    kv = torch.stack((k, v), dim=2).detach()
    assert torch.equal(flash_attn_kvpacked_func(q.detach(), kv, causal=True), expected)


# ---------------------------------------------------------------------------
# opcheck, torch.compile, gradcheck


def opcheck_cases():
    torch.manual_seed(5)
    def r(*shape, dtype=torch.float16, grad=False):
        return torch.randn(*shape, device=DEVICE, dtype=dtype, requires_grad=grad)
    q, k, v = r(2, 77, 4, 64, grad=True), r(2, 99, 2, 64, grad=True), r(2, 99, 2, 64, grad=True)
    q59, k59 = r(1, 50, 2, 59, grad=True), r(1, 70, 2, 59, grad=True)
    out, lse = torch.ops.flashlab.fwd(q, k, v, None, True, -1, -1, False, "auto")
    cu_q = torch.tensor([0, 30, 77], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 40, 99], dtype=torch.int32, device=DEVICE)
    qv, kv, vv = r(77, 4, 64, grad=True), r(99, 2, 64, grad=True), r(99, 2, 64, grad=True)
    vout, vlse = torch.ops.flashlab.varlen_fwd(qv, kv, vv, cu_q, cu_k, 47, 59, None, True, -1, -1,
                                               False, "auto")
    seqlens = torch.tensor([3, 17], dtype=torch.int32, device=DEVICE)
    return {
        "fwd": (torch.ops.flashlab.fwd.default, (q, k, v, None, True, -1, -1, False, "auto")),
        "fwd_d59_window": (torch.ops.flashlab.fwd.default,
                           (q59, k59, leaf(k59), 0.2, False, 10, 5, True, "auto")),
        "varlen_fwd": (torch.ops.flashlab.varlen_fwd.default,
                       (qv, kv, vv, cu_q, cu_k, 47, 59, None, True, -1, -1, False, "auto")),
        "bwd": (torch.ops.flashlab.bwd.default,
                (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(),
                 lse, None, True, -1, -1, True, "auto")),
        "varlen_bwd": (torch.ops.flashlab.varlen_bwd.default,
                       (torch.randn_like(vout), qv.detach(), kv.detach(), vv.detach(),
                        vout.detach(), vlse, cu_q, cu_k, 47, 59, None, True, -1, -1, False, "auto")),
        "fwd_kvcache": (torch.ops.flashlab.fwd_kvcache.default,
                        (r(2, 1, 4, 128), r(2, 64, 2, 128), r(2, 64, 2, 128), r(2, 1, 2, 128),
                         r(2, 1, 2, 128), seqlens, None, None, True, -1, -1, 0, "auto")),
    }


@pytest.mark.parametrize("case", ["fwd", "fwd_d59_window", "varlen_fwd", "bwd", "varlen_bwd",
                                  "fwd_kvcache"])
def test_opcheck(case):
    op, args = opcheck_cases()[case]
    results = torch.library.opcheck(op, args)
    assert set(results.values()) == {"SUCCESS"}, results


@pytest.mark.parametrize("head_dim", [64, 59])
def test_compile_fullgraph_matches_eager(head_dim):
    torch._dynamo.reset()
    torch.manual_seed(6)

    def block(q, k, v, w):
        out = flash_attn_func(q, k, v, causal=True, window_size=(100, 0))
        return (out.float() @ w).square().mean()

    q = torch.randn(2, 300, 4, head_dim, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 300, 2, head_dim, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    w = torch.randn(head_dim, 8, device=DEVICE)
    compiled = torch.compile(block, fullgraph=True)
    loss = compiled(q, k, v, w)
    grads = torch.autograd.grad(loss, (q, k, v))
    loss_eager = block(q, k, v, w)
    grads_eager = torch.autograd.grad(loss_eager, (q, k, v))
    torch.testing.assert_close(loss, loss_eager, rtol=1e-4, atol=1e-5)
    for grad, grad_eager in zip(grads, grads_eager):
        torch.testing.assert_close(grad, grad_eager, rtol=2e-2, atol=2e-3)


def test_compile_fullgraph_kvcache_appends_in_place():
    torch._dynamo.reset()
    torch.manual_seed(7)
    k_cache = torch.randn(2, 64, 2, 128, device=DEVICE, dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(2, 1, 4, 128, device=DEVICE, dtype=torch.float16)
    k, v = torch.randn(2, 1, 2, 128, device=DEVICE, dtype=torch.float16), \
        torch.randn(2, 1, 2, 128, device=DEVICE, dtype=torch.float16)
    seqlens = torch.tensor([5, 30], dtype=torch.int32, device=DEVICE)

    def decode(q, k_cache, v_cache, k, v, seqlens):
        return flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, causal=True)

    out = torch.compile(decode, fullgraph=True)(q, k_cache, v_cache, k, v, seqlens)
    for b, row in enumerate(seqlens.tolist()):
        assert torch.equal(k_cache[b, row], k[b, 0]) and torch.equal(v_cache[b, row], v[b, 0])
    assert torch.equal(out, decode(q, k_cache.clone(), v_cache.clone(), k, v, seqlens))


@pytest.mark.parametrize("causal,kv_heads", [(False, 2), (True, 1)])
def test_gradcheck_fa1_scalar_float32(causal, kv_heads):
    # fa1_scalar takes float32: finite differences of its forward against its backward.
    assert "fp32" in flashlab.kernels()["fa1_scalar"].summary
    torch.manual_seed(8)
    q = torch.randn(1, 6, 2, 16, device=DEVICE, dtype=torch.float32, requires_grad=True)
    k = torch.randn(1, 9, kv_heads, 16, device=DEVICE, dtype=torch.float32, requires_grad=True)
    v = torch.randn(1, 9, kv_heads, 16, device=DEVICE, dtype=torch.float32, requires_grad=True)

    def function(q, k, v):
        return flash_attn_func(q, k, v, causal=causal, kernel="fa1_scalar")

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "not double precision": float32 is the point here
        assert torch.autograd.gradcheck(function, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-2,
                                        nondet_tol=1e-6)


# ---------------------------------------------------------------------------
# flash_attn_with_kvcache: append in place, contiguous and paged caches


def kvcache_cases():
    head_dims = [32, 64, 96, 128, 256] if FULL_MATRIX else [64, 128]
    full = list(itertools.product(DTYPES, head_dims, [False, True], [1, 4], [0, 1, 3], MHA_TYPES,
                                  [False, True], [0, 1, 3]))
    # Default: every 11th case (11 is prime to every factor's size, so each value of each
    # factor comes up).
    cases = full if FULL_MATRIX else [c for n, c in enumerate(full) if n % 11 == 0]
    return [pytest.param(*c, id=f"{DTYPE_IDS[c[0]]}-d{c[1]}-{'paged' if c[2] else 'contiguous'}-"
                                f"q{c[3]}-new{c[4]}-{c[5]}-{'causal' if c[6] else 'full'}-splits{c[7]}")
            for c in cases]


@pytest.mark.parametrize("dtype,head_dim,paged,seqlen_q,seqlen_new,mha_type,causal,num_splits",
                         kvcache_cases())
def test_flash_attn_kvcache(dtype, head_dim, paged, seqlen_q, seqlen_new, mha_type, causal,
                            num_splits):
    rng = seeded("kvcache", dtype, head_dim, paged, seqlen_q, seqlen_new, mha_type, causal, num_splits)
    batch, capacity, page_size = 3, 256, 32
    kv_heads = KV_HEADS[mha_type]
    # The logical cache (batch, capacity, kv_heads, d); paged, its pages shuffled in a pool.
    logical_k = torch.randn(batch, capacity, kv_heads, head_dim, device=DEVICE, dtype=dtype)
    logical_v = torch.randn_like(logical_k)
    if paged:
        pages_per_sequence = capacity // page_size
        num_pages = batch * pages_per_sequence + 5
        order = torch.randperm(num_pages, device=DEVICE)[:batch * pages_per_sequence]
        block_table = order.view(batch, pages_per_sequence).to(torch.int32)
        k_cache = torch.randn(num_pages, page_size, kv_heads, head_dim, device=DEVICE, dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        k_cache[block_table.flatten().long()] = logical_k.reshape(-1, page_size, kv_heads, head_dim)
        v_cache[block_table.flatten().long()] = logical_v.reshape(-1, page_size, kv_heads, head_dim)

        def read(cache):
            return cache[block_table.flatten().long()].reshape(batch, capacity, kv_heads, head_dim)
    else:
        block_table = None
        k_cache, v_cache = logical_k.clone(), logical_v.clone()

        def read(cache):
            return cache
    lengths = [rng.randint(1, capacity - seqlen_new) for _ in range(batch)]
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    q = torch.randn(batch, seqlen_q, HEADS, head_dim, device=DEVICE, dtype=dtype)
    k_new = v_new = None
    expected_k, expected_v = logical_k.clone(), logical_v.clone()
    if seqlen_new:
        k_new = torch.randn(batch, seqlen_new, kv_heads, head_dim, device=DEVICE, dtype=dtype)
        v_new = torch.randn_like(k_new)
        for b, length in enumerate(lengths):
            expected_k[b, length:length + seqlen_new] = k_new[b]
            expected_v[b, length:length + seqlen_new] = v_new[b]
    k_pointer = k_cache.data_ptr()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens,
                                       block_table=block_table, causal=causal, num_splits=num_splits,
                                       return_softmax_lse=True)
    # The cache is written in place, and nothing else in it changes.
    assert k_cache.data_ptr() == k_pointer
    assert torch.equal(read(k_cache), expected_k) and torch.equal(read(v_cache), expected_v)
    assert out.shape == q.shape and lse.shape == (batch, HEADS, seqlen_q)
    # Sequence b attends to its first lengths[b] + seqlen_new keys.
    for b, length in enumerate(lengths):
        keys = length + seqlen_new
        check_forward_backward(
            dtype, out[b:b + 1], lse[b:b + 1],
            (q[b:b + 1], expected_k[b:b + 1, :keys], expected_v[b:b + 1, :keys]),
            lambda q, k, v: attention_ref(q, k, v, causal=causal))


def test_kvcache_int_cache_seqlens_broadcasts():
    torch.manual_seed(9)
    k_cache = torch.randn(2, 128, 2, 64, device=DEVICE, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(2, 1, 4, 64, device=DEVICE, dtype=torch.bfloat16)
    by_int = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=50, causal=True)
    by_tensor = flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.full((2,), 50, dtype=torch.int32, device=DEVICE),
        causal=True)
    assert torch.equal(by_int, by_tensor)
    # No cache_seqlens: every cache is full.
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, return_softmax_lse=True)
    check_forward_backward(torch.bfloat16, out, lse, (q, k_cache, v_cache),
                           lambda q, k, v: attention_ref(q, k, v))


def test_kvcache_pads_a_head_dim_without_a_kernel():
    # head_dim 59, which no KV-cache kernel has: the C++ API zero-pads q and the caches
    # to the kernel's 64 (copies), appends there and copies the cache back. The appended
    # row must land in the caller's cache and the result be the unpadded attention's.
    torch.manual_seed(10)
    k_cache = torch.randn(1, 64, 1, 59, device=DEVICE, dtype=torch.float16)
    v_cache = torch.randn(1, 64, 1, 59, device=DEVICE, dtype=torch.float16)
    k_new = torch.randn(1, 1, 1, 59, device=DEVICE, dtype=torch.float16)
    v_new = torch.randn(1, 1, 1, 59, device=DEVICE, dtype=torch.float16)
    q = torch.randn(1, 1, 2, 59, device=DEVICE, dtype=torch.float16)
    untouched = k_cache[:, 41:].clone()
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=40,
                                       return_softmax_lse=True)
    assert torch.equal(k_cache[:, 40], k_new[:, 0]) and torch.equal(v_cache[:, 40], v_new[:, 0])
    assert torch.equal(k_cache[:, 41:], untouched)
    check_forward_backward(torch.float16, out, lse, (q, k_cache[:, :41], v_cache[:, :41]),
                           lambda q, k, v: attention_ref(q, k, v))
