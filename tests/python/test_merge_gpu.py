"""flashlab::merge_attention_states_ (the ring's merge step, one kernel on the split-KV
combine's LSE rule) against merge_partial's torch math in float64: dense and packed
layouts, strided views (the zigzag ring merges into the second half of its rows), every
block dtype, rows that saw no key in one part or in both."""
import pytest
import torch

import flashlab  # noqa: F401  (the operators)
from flashlab.distributed import merge_partial
from conftest import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]


def _parts(shape, lse_shape, dtype, generator):
    normal = lambda *s: torch.randn(*s, generator=generator)  # noqa: E731
    out, block = normal(*shape), normal(*shape).to(dtype)
    lse, block_lse = normal(*lse_shape) * 3, normal(*lse_shape) * 3
    lse.view(-1)[::7] = float("-inf")         # the accumulator saw no key yet
    block_lse.view(-1)[::5] = float("-inf")   # the block saw none
    out.view(-1, shape[-1])[lse.transpose(-1, -2).reshape(-1) == float("-inf")] = 0
    return out, lse, block, block_lse


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_merge_matches_torch_math(dtype, packed):
    generator = torch.Generator().manual_seed(7)
    shape, lse_shape = ((113, 6, 72), (6, 113)) if packed else ((2, 113, 6, 72), (2, 6, 113))
    out, lse, block, block_lse = _parts(shape, lse_shape, dtype, generator)
    expected_out, expected_lse = merge_partial(out.double(), lse.double(), block.double(), block_lse.double())
    gpu_out, gpu_lse = out.cuda(), lse.cuda()
    torch.ops.flashlab.merge_attention_states_(gpu_out, gpu_lse, block.cuda(), block_lse.cuda())
    torch.testing.assert_close(gpu_lse.cpu().double(), expected_lse, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gpu_out.cpu().double(), expected_out, rtol=1e-5, atol=1e-5)
    both_empty = (lse == float("-inf")) & (block_lse == float("-inf"))
    assert both_empty.any() and torch.isneginf(gpu_lse.cpu()[both_empty]).all()
    assert torch.isfinite(gpu_out).all()


def test_merge_into_a_strided_half():
    generator = torch.Generator().manual_seed(8)
    out, lse, block, block_lse = _parts((2, 128, 4, 64), (2, 4, 128), torch.bfloat16, generator)
    gpu_out, gpu_lse = out.cuda(), lse.cuda()
    half_out, half_lse = gpu_out[:, 64:], gpu_lse[..., 64:]
    torch.ops.flashlab.merge_attention_states_(half_out, half_lse, block[:, 64:].cuda().contiguous(),
                                               block_lse[..., 64:].cuda().contiguous())
    expected_out, expected_lse = merge_partial(out[:, 64:].double(), lse[..., 64:].double(),
                                               block[:, 64:].double(), block_lse[..., 64:].double())
    torch.testing.assert_close(gpu_out[:, 64:].cpu().double(), expected_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gpu_lse[..., 64:].cpu().double(), expected_lse, rtol=1e-5, atol=1e-5)
    assert torch.equal(gpu_out[:, :64].cpu(), out[:, :64]) and torch.equal(gpu_lse[..., :64].cpu(), lse[..., :64])


def test_bad_arguments_say_what_is_expected():
    out = torch.zeros(1, 4, 2, 8, device="cuda")
    lse = torch.zeros(1, 2, 4, device="cuda")
    with pytest.raises(ValueError, match="out .the accumulator. must be float32"):
        torch.ops.flashlab.merge_attention_states_(out.half(), lse, out.half(), lse)
    with pytest.raises(ValueError, match=r"block_lse is \[1, 4, 2\]"):
        torch.ops.flashlab.merge_attention_states_(out, lse, out, lse.transpose(1, 2))
