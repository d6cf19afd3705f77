"""flashlab.fp8 on the CPU (issue 36): quantize's descale factors and rounding, dequantize,
packed (variable-length) tensors, and random_hadamard's rotation (orthogonal, Q K^T unchanged)."""
import pytest
import torch

from flashlab import fp8


def test_quantize_gives_one_descale_per_batch_and_kv_head():
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(3, 37, 6, 128, generator=generator)
    x[1, :, 4] *= 50  # query head 4 is in kv head 2's group (6 heads over 3): only that factor grows
    values, descale = fp8.quantize(x, kv_heads=3)
    assert values.dtype == torch.float8_e4m3fn and values.shape == x.shape
    assert descale.dtype == torch.float32 and descale.shape == (3, 3) and descale.is_contiguous()
    amax = x.abs().reshape(3, 37, 3, 2, 128).amax(dim=(1, 3, 4))
    torch.testing.assert_close(descale, amax / 448.0)
    assert descale[1, 2] > 20 * descale[1, 1]
    # every group's largest value lands on e4m3's largest, 448
    grouped = values.float().abs().reshape(3, 37, 3, 2, 128).amax(dim=(1, 3, 4))
    assert torch.equal(grouped, torch.full_like(grouped, 448.0))


def test_dequantize_is_within_e4m3_rounding():
    generator = torch.Generator().manual_seed(12)
    x = torch.randn(2, 113, 4, 64, generator=generator, dtype=torch.float64)
    values, descale = fp8.quantize(x, kv_heads=2)
    back = fp8.dequantize(values, descale, torch.float64)
    step = descale.double().repeat_interleave(2, dim=1)[:, None, :, None]
    # normals: half of e4m3's 3-bit mantissa step (2^-4 relative); subnormals: 2^-10 x descale
    bound = x.abs() * 2.0 ** -4 + step * 2.0 ** -10
    assert ((back - x).abs() <= bound).all()
    assert (back - x).abs().max() > 0  # it does round


def test_packed_sequences_are_quantized_as_their_own_batches():
    generator = torch.Generator().manual_seed(14)
    lengths = [5, 0, 113, 1]
    cu_seqlens = torch.tensor([0, 5, 5, 118, 119], dtype=torch.int32)
    x = torch.randn(119, 8, 128, generator=generator)
    x[5:118, :, 7] *= 30  # an outlier channel in sequence 2 only: only its factors grow
    values, descale = fp8.quantize(x, kv_heads=2, cu_seqlens=cu_seqlens)
    assert values.shape == x.shape and descale.shape == (4, 2)
    assert torch.equal(descale[1], torch.ones(2))  # empty: nothing to scale
    start = 0
    for index, length in enumerate(lengths):
        if length:
            alone_values, alone_descale = fp8.quantize(x[start:start + length].unsqueeze(0), kv_heads=2)
            assert torch.equal(descale[index], alone_descale[0])
            assert torch.equal(values[start:start + length].float(), alone_values[0].float())
        start += length
    assert descale[2].min() > 10 * descale[0].max()
    back = fp8.dequantize(values, descale, torch.float32, cu_seqlens=cu_seqlens)
    torch.testing.assert_close(back, x, rtol=2.0 ** -4, atol=descale.max().item() * 2.0 ** -10)
    with pytest.raises(ValueError, match="cu_seqlens covers 118 rows; the packed tensor has 119"):
        fp8.quantize(x, kv_heads=2, cu_seqlens=cu_seqlens[:-1])


def test_quantize_refuses_what_it_cannot_group():
    with pytest.raises(ValueError, match=r"must be \(batch, seqlen, heads, head_dim\); got shape \(4, 8, 16\)"):
        fp8.quantize(torch.randn(4, 8, 16))
    with pytest.raises(ValueError, match=r"must be \(total, heads, head_dim\) with cu_seqlens; got shape \(1, 4, 8, 16\)"):
        fp8.quantize(torch.randn(1, 4, 8, 16), cu_seqlens=torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"heads \(6\) must be a multiple of kv_heads \(4\)"):
        fp8.quantize(torch.randn(1, 8, 6, 16), kv_heads=4)


def test_random_hadamard_rotates_without_changing_qk():
    rotation = fp8.random_hadamard(128, seed=3, dtype=torch.float64)
    torch.testing.assert_close(rotation @ rotation.T, torch.eye(128, dtype=torch.float64))
    assert not torch.equal(rotation, fp8.random_hadamard(128, seed=4, dtype=torch.float64))
    generator = torch.Generator().manual_seed(13)
    q, k = (torch.randn(2, 50, 4, 128, generator=generator, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(torch.einsum("bqhd,bkhd->bhqk", q @ rotation, k @ rotation),
                               torch.einsum("bqhd,bkhd->bhqk", q, k))
    # an outlier channel spreads over all channels
    outlier = torch.zeros(128, dtype=torch.float64)
    outlier[5] = 1.0
    assert (outlier @ rotation).abs().max() < 0.1
    with pytest.raises(ValueError, match="power of two; got 96"):
        fp8.random_hadamard(96)
