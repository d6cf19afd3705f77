"""The GPU suite's reference attention (attention_reference.py) against torch's
scaled_dot_product_attention with an explicit mask, on the CPU in float64."""
import pytest
import torch

from attention_reference import attention_ref, sink_gradient_stored_output_term, varlen_attention_ref, visible


def test_causal_mask_aligns_bottom_right():
    # flash-attn's docstring example: seqlen_q 2, seqlen_k 5, and seqlen_q 5, seqlen_k 2.
    assert visible(2, 5, causal=True).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert visible(5, 2, causal=True).int().tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]
    assert visible(3, 6, window=(1, 0)).int().tolist() == [
        [0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (3, 2)),
                                           (True, (4, -1))])
@pytest.mark.parametrize("seqlens", [(7, 13), (13, 7), (1, 5)])
def test_matches_sdpa(causal, window, seqlens):
    torch.manual_seed(0)
    seqlen_q, seqlen_k = seqlens
    q = torch.randn(2, seqlen_q, 6, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, seqlen_k, 2, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, seqlen_k, 2, 16, dtype=torch.float64, requires_grad=True)
    out, lse = attention_ref(q, k, v, causal=causal, window=window)
    mask = visible(seqlen_q, seqlen_k, causal, window)
    rows = mask.any(-1)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(3, 2).transpose(1, 2),
        v.repeat_interleave(3, 2).transpose(1, 2), attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(out[:, rows], expected[:, rows])
    assert torch.equal(out[:, ~rows], torch.zeros_like(out[:, ~rows]))
    assert lse[..., ~rows].isinf().all()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(3, 2)) / 4.0
    expected_lse = torch.logsumexp(scores.masked_fill(~mask, float("-inf")), -1).float()
    torch.testing.assert_close(lse[..., rows], expected_lse[..., rows])
    # Gradients flow and are finite even with rows that see no key.
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(g.isfinite().all() for g in (dq, dk, dv))
    assert torch.equal(dq[:, ~rows], torch.zeros_like(dq[:, ~rows]))


def test_varlen_is_one_sequence_at_a_time():
    torch.manual_seed(1)
    q, k, v = torch.randn(9, 2, 8), torch.randn(12, 1, 8), torch.randn(12, 1, 8)
    cu_q, cu_k = torch.tensor([0, 4, 9]), torch.tensor([0, 7, 12])
    out, lse = varlen_attention_ref(q, k, v, cu_q, cu_k, causal=True)
    second, second_lse = attention_ref(q[None, 4:], k[None, 7:], v[None, 7:], causal=True)
    torch.testing.assert_close(out[4:], second[0])
    torch.testing.assert_close(lse[:, 4:], second_lse[0])
    assert out.shape == q.shape and lse.shape == (2, 9)


def test_sink_gradient_stored_output_term_is_twice_the_formulas_shift():
    """The GPU suite's dsinks term: twice the largest change, over heads, of -sum over rows of
    exp(sink - LSE) * rowsum(dout * out) when out is rounded to the dtype (a row-by-row loop
    here), fixed-length and packed alike."""
    torch.manual_seed(2)
    q = torch.randn(2, 7, 4, 16, dtype=torch.float64)
    k, v = torch.randn(2, 13, 2, 16, dtype=torch.float64), torch.randn(2, 13, 2, 16, dtype=torch.float64)
    dout, sinks = torch.randn_like(q), torch.randn(4, dtype=torch.float64)
    out, lse = attention_ref(q, k, v, causal=True, softcap=1.5, sinks=sinks)
    shift = torch.zeros(4, dtype=torch.float64)
    for b in range(2):
        for h in range(4):
            for i in range(7):
                stored = out[b, i, h].half().double()
                shift[h] -= torch.exp(sinks[h] - lse[b, h, i]) * (dout[b, i, h] * (stored - out[b, i, h])).sum()
    expected = 2 * shift.abs().max().item()
    assert expected > 0
    assert sink_gradient_stored_output_term(out, lse, dout, sinks, torch.float16) == pytest.approx(expected, rel=1e-6)
    cu_q, cu_k = torch.tensor([0, 7, 14]), torch.tensor([0, 13, 26])
    packed, packed_lse = varlen_attention_ref(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k,
                                              causal=True, softcap=1.5, sinks=sinks)
    assert sink_gradient_stored_output_term(packed, packed_lse, dout.flatten(0, 1), sinks, torch.float16) == \
        pytest.approx(expected, rel=1e-6)
