"""A flash-attn-style case matrix for a user's function, and its pytest parametrization."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from ._problem import problem as make_problem

# flash-attn's test lengths are odd on purpose: partial tiles on both sides, seqlen_q !=
# seqlen_k (bottom-right causal), a single query row, lengths past a power of two.
SEQLENS = ((1, 239), (7, 113), (113, 203), (128, 217), (113, 113), (1023, 1024), (1024, 1023))


@dataclass(frozen=True)
class Case:
    """One case of the matrix: keywords for flashlab.testing.problem."""
    options: Tuple[Tuple[str, object], ...]

    def problem(self, device=None):
        return make_problem(device=device, **dict(self.options))

    @property
    def id(self) -> str:
        o = dict(self.options)
        parts = [f"{o['seqlen_q']}x{o['seqlen_k']}", f"d{o['head_dim']}", str(o["dtype"]),
                 f"h{o['heads']}kv{o['kv_heads']}"]
        if o.get("causal"):
            parts.append("causal")
        if o.get("window"):
            parts.append("window{}_{}".format(*o["window"]))
        return "-".join(parts)


def cases(head_dims: Sequence[int] = (64, 128), dtypes: Sequence[str] = ("fp16", "bf16"),
          causal: Sequence[bool] = (False, True), seqlens: Sequence[Tuple[int, int]] = SEQLENS,
          heads: int = 6, kv_heads: Sequence[int] = (6, 2, 1), windows: Sequence[Optional[Tuple[int, int]]] = (None,),
          batch: int = 2, seed: int = 0):
    """The matrix: every head dim x dtype x causal x (seqlen_q, seqlen_k) x kv heads (MHA,
    GQA, MQA) x window, each with its own seed (seed + its index), as a list of Case."""
    matrix = []
    for head_dim in head_dims:
        for dtype in dtypes:
            for is_causal in causal:
                for seqlen_q, seqlen_k in seqlens:
                    for kv in kv_heads:
                        for window in windows:
                            options = dict(batch=batch, heads=heads, kv_heads=kv, seqlen_q=seqlen_q,
                                           seqlen_k=seqlen_k, head_dim=head_dim, dtype=dtype, causal=is_causal,
                                           seed=seed + len(matrix))
                            if window is not None:
                                options["window"] = tuple(window)
                            matrix.append(Case(tuple(options.items())))
    return matrix


def parametrize(**matrix):
    """pytest.mark.parametrize("case", cases(**matrix)) with readable ids:

        @flashlab.testing.parametrize(head_dims=(64, 128))
        def test_my_attention(case):
            flashlab.testing.check(my_attention, case.problem(), tile=(64, 64), raise_on_failure=True)
    """
    import pytest
    selected = cases(**matrix)
    return pytest.mark.parametrize("case", selected, ids=[c.id for c in selected])
