"""The FP8 (e4m3) forward (issue 36) through flash_attn_func: q, k, v quantized with one
descale factor per (batch, kv head), against float64 attention of the dequantized values.
The pass rule is the 16-bit suites' with the FP8 path's own arithmetic as the "same
precision" path: max error <= 2 x that of fp8_emulated_attention (q k^T on the FP8 tensor
cores through torch._scaled_mm with fast accumulation, as the kernel's wgmma accumulates; P
rounded to e4m3 as the kernel rounds it; output rounded to the output dtype) + the output
dtype's rounding. (With exact q k^T instead, the outlier cases failed: Hopper's FP8
accumulator keeps about 14 bits, DeepSeek-V3's report says, and with 20x channels the
products' rounding moves the logits; H100, session 26.) The
LSE as flashlab-run --dtype e4m3 checks it: twice the larger error of torch in the output's 16-bit
dtype on the same dequantized inputs and of the FP8 path's own LSE. Odd sizes, GQA/MQA, masks,
inputs with outlier channels; then every refusal's message."""
import pytest
import torch
import torch.nn.functional as F

from flashlab import flash_attn_func, flash_attn_varlen_func, fp8
from attention_reference import E4M3, assert_close_to_reference, attention_ref, fp8_emulated_attention
from conftest import requires_cuda

DEVICE = "cuda"
requires_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="the FP8 forward is fa3_wgmma_sm90's, on compute capability 9.0 (sm_90a) only")
pytestmark = [pytest.mark.gpu, requires_cuda, requires_sm90]


def fp8_problem(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, outliers, seed):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v = (torch.randn(batch, s, h, head_dim, device=DEVICE, generator=generator)
               for s, h in ((seqlen_q, heads), (seqlen_k, kv_heads), (seqlen_k, kv_heads)))
    if outliers:  # the same few channels 20x larger, as activations' outlier features are
        for x in (q, k, v):
            x[..., 3:7] *= 20.0
    return [fp8.quantize(x, kv_heads) for x in (q, k, v)]


def larger_error(reference, *candidates):
    """The candidate furthest from reference over its finite elements (rows that see no key
    are -inf in every one)."""
    finite = torch.isfinite(reference)
    error = lambda x: (x.double() - reference.double())[finite].abs().max().item() if finite.any() else 0.0  # noqa: E731
    return max(candidates, key=error)


def tensor_core_products(q8, k8, q_descale, k_descale):
    """float64 (batch, heads, seqlen_q, seqlen_k): q8 k8^T on the FP8 tensor cores (torch._scaled_mm,
    use_fast_accum: no promotion of partial sums, as in the kernel's wgmma chain), times the descales."""
    batch, seqlen_q, heads, head_dim = q8.shape
    seqlen_k, kv_heads = k8.shape[1], k8.shape[2]
    group = heads // kv_heads
    padded = lambda x, rows: F.pad(x.float(), (0, 0, 0, -rows % 16)).to(E4M3)  # noqa: E731 (rows: multiples of 16)
    one = torch.ones((), device=q8.device)
    products = torch.empty(batch, heads, seqlen_q, seqlen_k, dtype=torch.float64, device=q8.device)
    for b in range(batch):
        for h in range(heads):
            a, bt = padded(q8[b, :, h], seqlen_q), padded(k8[b, :, h // group], seqlen_k)
            s = torch._scaled_mm(a, bt.t(), one, one, out_dtype=torch.float32, use_fast_accum=True)
            products[b, h] = s[:seqlen_q, :seqlen_k].double() * (q_descale[b, h // group] * k_descale[b, h // group]).double()
    return products


# (head_dim, batch, seqlen_q, seqlen_k, heads, kv_heads, causal, window, outliers, out_dtype)
CASES = [
    (128, 2, 1023, 1023, 8, 2, False, (-1, -1), False, torch.bfloat16),
    (128, 1, 113, 4097, 4, 1, True, (-1, -1), False, torch.bfloat16),
    (128, 2, 777, 1500, 6, 2, False, (100, 50), True, torch.float16),
    (128, 3, 1, 7, 2, 2, False, (-1, -1), False, torch.bfloat16),
    (64, 2, 1023, 1023, 8, 2, False, (-1, -1), False, torch.bfloat16),
    (64, 1, 113, 4097, 4, 1, True, (-1, -1), True, torch.float16),
    (256, 2, 1024, 1023, 4, 4, True, (-1, -1), False, torch.bfloat16),
    (256, 1, 7, 700, 2, 1, False, (-1, -1), True, torch.bfloat16),
    (256, 1, 4097, 4097, 2, 2, True, (-1, -1), False, torch.float16),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: (
    f"d{c[0]}-b{c[1]}-{c[2]}x{c[3]}-h{c[4]}/{c[5]}-{'causal' if c[6] else 'full'}"
    f"{'-window' if c[7] != (-1, -1) else ''}{'-outliers' if c[8] else ''}-{str(c[9])[6:]}"))
def test_fp8_forward_matches_dequantized_reference(case):
    head_dim, batch, seqlen_q, seqlen_k, heads, kv_heads, causal, window, outliers, out_dtype = case
    (q8, qd), (k8, kd), (v8, vd) = fp8_problem(batch, seqlen_q, seqlen_k, heads, kv_heads, head_dim, outliers,
                                               seed=seqlen_q * 31 + seqlen_k)
    out, lse, _ = flash_attn_func(q8, k8, v8, causal=causal, window_size=window, return_attn_probs=True,
                                  q_descale=qd, k_descale=kd, v_descale=vd,
                                  out_dtype=None if out_dtype == torch.bfloat16 else out_dtype)
    assert out.dtype == out_dtype and out.shape == (batch, seqlen_q, heads, head_dim)
    assert not out.isnan().any() and not out.isinf().any()
    q, k, v = (fp8.dequantize(x, d, torch.float64) for x, d in ((q8, qd), (k8, kd), (v8, vd)))
    out_ref, lse_ref = attention_ref(q, k, v, causal=causal, window=window)
    products = tensor_core_products(q8, k8, qd, kd)
    out_fp8_path, lse_fp8_path = fp8_emulated_attention(q, k, v, causal=causal, window=window, products=products,
                                                        return_lse=True)
    assert_close_to_reference("out", out, out_ref, out_fp8_path.to(out_dtype), 2, out_dtype)
    # The LSE, as flashlab-run --dtype e4m3 checks it: twice the larger error of torch in the
    # output's 16-bit dtype on the same (dequantized) values and of the FP8 path's own LSE (the
    # FP8 wgmma accumulates S in less than float32's precision: 7e-5 off at 113x4097 on the H100,
    # where float32 torch is 1e-6 off; with outliers and an fp16 output the FP8 path's error is
    # the larger, harness call 2 of session 27).
    _, lse_16bit = attention_ref(*(x.to(out_dtype) for x in (q, k, v)), causal=causal, window=window)
    assert_close_to_reference("lse", lse, lse_ref, larger_error(lse_ref, lse_fp8_path, lse_16bit), 2, out_dtype)


# (head_dim, seqlens_q, seqlens_k, heads, kv_heads, causal, window): empty sequences, queries
# without keys, lengths off the 16-key groups of V^T and off the 128-key tiles.
VARLEN_CASES = [
    (128, [1, 0, 513, 7, 1000], [300, 5, 0, 1000, 17], 8, 2, False, (-1, -1)),
    (128, [1, 0, 513, 7, 1000], [1, 0, 513, 7, 1000], 4, 1, True, (-1, -1)),
    (256, [129, 64, 3, 777], [200, 31, 1, 1023], 4, 2, True, (50, 0)),
    (64, [129, 64, 3, 777], [200, 31, 1, 1023], 8, 2, False, (-1, -1)),
]


@pytest.mark.parametrize("case", VARLEN_CASES, ids=lambda c: (
    f"d{c[0]}-{len(c[1])}seqs-h{c[3]}/{c[4]}-{'causal' if c[5] else 'full'}{'-window' if c[6] != (-1, -1) else ''}"))
def test_fp8_varlen_equals_each_sequence_alone(case):
    """flash_attn_varlen_func on packed e4m3 sequences (a descale row each) gives, bitwise, what
    flash_attn_func gives each sequence alone (whose results the test above holds to the
    reference): the same tiles and arithmetic, only the V^T layout and the offsets differ."""
    head_dim, seqlens_q, seqlens_k, heads, kv_heads, causal, window = case
    generator = torch.Generator(device=DEVICE).manual_seed(sum(seqlens_q) * 7 + head_dim)
    offsets = lambda lengths: torch.tensor([0] + lengths, device=DEVICE).cumsum(0).to(torch.int32)  # noqa: E731
    cu_q, cu_k = offsets(seqlens_q), offsets(seqlens_k)
    q, k, v = (torch.randn(sum(lengths), h, head_dim, device=DEVICE, generator=generator)
               for lengths, h in ((seqlens_q, heads), (seqlens_k, kv_heads), (seqlens_k, kv_heads)))
    (q8, qd), (k8, kd), (v8, vd) = (fp8.quantize(x, kv_heads, cu) for x, cu in ((q, cu_q), (k, cu_k), (v, cu_k)))
    out, lse, _ = flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                         window_size=window, return_attn_probs=True, q_descale=qd, k_descale=kd,
                                         v_descale=vd)
    assert out.dtype == torch.bfloat16 and out.shape == (sum(seqlens_q), heads, head_dim)
    assert lse.shape == (heads, sum(seqlens_q))
    assert torch.isfinite(out).all()
    for b, (length_q, length_k) in enumerate(zip(seqlens_q, seqlens_k)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if length_q == 0:
            continue
        if length_k == 0:  # no key: 0 and LSE -inf
            assert (out[rows] == 0).all() and (lse[:, rows] == float("-inf")).all()
            continue
        keys = slice(int(cu_k[b]), int(cu_k[b + 1]))
        alone, alone_lse, _ = flash_attn_func(q8[rows][None], k8[keys][None], v8[keys][None], causal=causal,
                                              window_size=window, return_attn_probs=True,
                                              q_descale=qd[b:b + 1], k_descale=kd[b:b + 1], v_descale=vd[b:b + 1])
        assert torch.equal(out[rows], alone[0]), f"sequence {b}: max difference {(out[rows] - alone[0]).abs().max()}"
        assert torch.equal(lse[:, rows], alone_lse[0]), f"sequence {b}'s LSE"


def test_fp8_descale_defaults_to_one():
    (q8, _), (k8, _), (v8, _) = fp8_problem(1, 200, 300, 4, 2, 128, False, seed=1)
    ones = torch.ones(1, 2, device=DEVICE)
    out_default = flash_attn_func(q8, k8, v8)
    out_ones = flash_attn_func(q8, k8, v8, q_descale=ones, k_descale=ones, v_descale=ones)
    assert torch.equal(out_default, out_ones)


def test_fp8_refusals_say_what_was_given_and_what_is_expected():
    (q8, qd), (k8, kd), (v8, vd) = fp8_problem(2, 64, 64, 4, 2, 128, False, seed=2)
    with pytest.raises(RuntimeError, match=r"q_descale must be float32 of shape \(batch, kv_heads\) = \(2, 2\)"):
        flash_attn_func(q8, k8, v8, q_descale=qd[:, :1])
    with pytest.raises(RuntimeError, match="fa2_mma_sm80 .*e4m3"):
        flash_attn_func(q8, k8, v8, kernel="fa2_mma_sm80")
    # head_dim 96 has no FP8 tiling: the public API pads it with zeros to 128, as for 16 bits
    # (flashlab-run, which runs kernels at their own head dims, refuses it).
    d96 = [x[..., :96].contiguous() for x in (q8, k8, v8)]
    padded = [F.pad(x.float(), (0, 32)).to(E4M3) for x in d96]
    descales = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    assert torch.equal(flash_attn_func(*d96, **descales),
                       flash_attn_func(*padded, softmax_scale=96 ** -0.5, **descales)[..., :96])
    with pytest.raises(RuntimeError, match="e4m3"):
        flash_attn_func(*(F.pad(x.float(), (0, 192)).to(E4M3) for x in (q8, k8, v8)), **descales)  # 320
    with pytest.raises(NotImplementedError, match="applies no softcap"):
        flash_attn_func(q8, k8, v8, softcap=5.0)
    with pytest.raises(ValueError, match="are for torch.float8_e4m3fn q, k, v; got torch.bfloat16"):
        flash_attn_func(*(x.to(torch.bfloat16) for x in (q8, k8, v8)), q_descale=qd)
    with pytest.raises(RuntimeError, match="output_dtype of an e4m3 forward must be BFloat16 or Half"):
        flash_attn_func(q8, k8, v8, out_dtype=torch.float32)
    out, lse = torch.ops.flashlab.fwd_fp8(q8, k8, v8)
    with pytest.raises(RuntimeError, match="backward takes no e4m3 \\(FP8\\) inputs"):
        torch.ops.flashlab.bwd(out.to(E4M3), q8, k8, v8, out.to(E4M3), lse)
