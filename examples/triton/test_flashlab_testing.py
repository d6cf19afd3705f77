"""The Triton example through flashlab.testing (issue 35): the correct kernel passes a
flash-attn-style case matrix under the project's pass rule; the planted bug is located by
key tile, row and statistic (trace_tiles) and by its first bad output element (check);
the CLI says the same. On the CPU the kernels run in Triton's interpreter (fp16 only: its
bf16 is broken) on a few cases; on a GPU, the matrix in fp16 and bf16.

    PYTHONPATH=src/python FLASHLAB_OPS_LIBRARY=build/release/python/libflashlab_ops.so \\
        python -m pytest -q examples/triton/test_flashlab_testing.py
"""
import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from triton_setup import DEVICE, ON_GPU, require_triton  # noqa: E402

require_triton()
import flashlab.testing as ft  # noqa: E402
from flashlab.testing.__main__ import main as cli  # noqa: E402
from flashlab.testing.pytest_plugin import flashlab_check  # noqa: E402,F401  (the fixture)
from flash_attention_triton import attention, attention_planted_bug  # noqa: E402

TILE = (64, 64)  # the example's default block_m, block_n
EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_attention_triton.py")

if ON_GPU:
    MATRIX = ft.cases(head_dims=(64, 128), dtypes=("fp16", "bf16"))
else:  # the interpreter is slow and cuRAND's host generator takes seconds a problem: a few cases
    MATRIX = [c for c in ft.cases(head_dims=(64, 128), dtypes=("fp16",), kv_heads=(2,), batch=1)
              if dict(c.options)["seqlen_q"] in (7, 113) and (dict(c.options)["head_dim"] == 64) !=
              dict(c.options)["causal"]]


@pytest.mark.parametrize("case", MATRIX, ids=[c.id for c in MATRIX])
def test_correct_kernel_passes_the_matrix(case, flashlab_check):
    flashlab_check(attention, case.problem(DEVICE), tile=TILE)


@functools.lru_cache(maxsize=None)
def planted_problem():
    # Rows 64..127 see key tiles 0 and 1 only: a row whose maximum moves in tile 1 is wrong.
    return ft.problem(device=DEVICE, batch=1, heads=2, kv_heads=1, seqlen_q=200, seqlen_k=200, head_dim=64,
                      dtype="fp16", causal=True, seed=11)


def test_planted_bug_located_by_key_tile_row_and_statistic():
    problem = planted_problem()
    report = ft.check(attention_planted_bug, problem, tile=TILE)
    assert not report.passed
    first_bad = report.first_bad
    assert first_bad["query_tile"] == 1 and first_bad["key_tiles"] == [0, 1]
    trace = ft.trace_tiles(attention_planted_bug, problem, tile=TILE)
    difference = trace.first_difference
    assert difference["key_tile"] == 1 and difference["statistic"] == "l"
    assert (difference["batch"], difference["head"], difference["row"]) == \
        (first_bad["batch"], first_bad["head"], first_bad["row"])
    assert "every state up to key tile 0 matches" in trace.text
    assert ft.trace_tiles(attention, problem, tile=TILE).matches


def test_cli_locates_the_planted_bug(capsys):
    arguments = ["--batch", "1", "--heads", "2", "--kv-heads", "1", "--seqlen-q", "200", "--head-dim", "64",
                 "--causal", "--seed", "11", "--device", DEVICE, "--tile", "64x64"]
    assert cli(["check", f"{EXAMPLE}:attention_planted_bug", "--trace-tiles", *arguments]) == 1
    out = capsys.readouterr().out
    assert "first bad element (batch 0, row 73" in out
    assert "first difference: key tile 1 (keys 64..127), batch 0, head 0, row 73" in out
    assert cli(["check", f"{EXAMPLE}:attention", "--trace-tiles", *arguments]) == 0
