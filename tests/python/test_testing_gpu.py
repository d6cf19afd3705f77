"""flashlab.testing on the GPU (issue 35): the same verdicts as flashlab-run for the same
seed and shape (registered kernels and the planted-bug ones: first bad element and errors,
forward and backward), inputs equal on the GPU and the CPU, flashlab's own API checked
and benchmarked through it. flashlab-run comes from $FLASHLAB_RUN (ctest sets it to the
build tree's) or the PATH."""
import json
import os
import shutil
import subprocess

import pytest
import torch

import flashlab
import flashlab.testing as ft
from conftest import requires_cuda

pytestmark = [pytest.mark.gpu, requires_cuda]

FLASHLAB_RUN = os.environ.get("FLASHLAB_RUN") or shutil.which("flashlab-run")
needs_flashlab_run = pytest.mark.skipif(FLASHLAB_RUN is None, reason="flashlab-run not found ($FLASHLAB_RUN)")


def flashlab_run(arguments):
    """flashlab-run's --json object (its last line) and exit code."""
    result = subprocess.run([FLASHLAB_RUN, *arguments, "--json", "--repeat", "0"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.returncode


PROBLEMS = [
    ["--batch", "2", "--heads", "6", "--kv-heads", "2", "--seqlen-q", "113", "--seqlen-k", "203", "--head-dim", "64",
     "--dtype", "fp16", "--seed", "5"],
    # head_dim 64: fa2_mma_sm80_planted_bug is built for it alone.
    ["--batch", "1", "--heads", "4", "--seqlen-q", "1023", "--head-dim", "64", "--dtype", "bf16", "--causal",
     "--seed", "9"],
]
KERNELS = ["fa2_mma_sm80", "fa2_mma_sm80_planted_bug", "fa1_scalar_planted_bug"]


@needs_flashlab_run
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("arguments", PROBLEMS, ids=["gqa-113x203-fp16", "causal-1023-bf16"])
def test_same_verdict_as_flashlab_run(kernel, arguments):
    expected, code = flashlab_run(["--kernel", kernel, *arguments])
    problem = ft.problem_from_arguments(arguments)
    report = ft.check(kernel, problem, tile=(expected["block_q"], expected["block_k"]))
    assert report.passed == expected["passed"] == (code == 0)
    assert report.data["max_abs_err"] == pytest.approx(expected["max_abs_err"], rel=1e-6, abs=1e-9)
    assert report.data["tolerance"] == pytest.approx(expected["tolerance"], rel=1e-9)
    assert report.data["first_bad"] == expected["first_bad"]
    assert report.data["lse_first_bad"] == expected["lse_first_bad"]
    if "planted_bug" in kernel:
        assert not report.passed and report.first_bad is not None


@needs_flashlab_run
@pytest.mark.parametrize("kernel", ["fa2_mma_sm80", "fa1_scalar"])  # the planted-bug kernels have no backward
def test_same_backward_verdict_as_flashlab_run(kernel):
    arguments = PROBLEMS[0]
    expected, _ = flashlab_run(["--kernel", kernel, "--backward", *arguments])
    problem = ft.problem_from_arguments(arguments)
    report = ft.check_backward(kernel, problem, tile=(expected["block_q"], expected["block_k"]))
    assert report.passed == expected["passed"]
    where = lambda bad: None if bad is None else {key: bad[key] for key in  # noqa: E731
                                                  ("batch", "row", "head", "col", "actual", "expected")}
    for name in ("out", "lse", "dq", "dk", "dv"):
        mine, theirs = report.tensor(name), expected["tensors"][name]
        assert mine["max_abs_err"] == pytest.approx(theirs["max_abs_err"], rel=1e-6, abs=1e-9), name
        # The element and values (the tile annotation of dq/dk/dv uses the kernel's backward tiles there).
        assert where(mine["first_bad"]) == where(theirs["first_bad"]), name


def test_inputs_equal_on_gpu_and_cpu():
    arguments = PROBLEMS[0] + ["--sinks", "--alibi", "per-head"]
    on_gpu, on_cpu = ft.problem_from_arguments(arguments, "cuda"), ft.problem_from_arguments(arguments, "cpu")
    for a, b in zip(on_gpu.tensors + [on_gpu.dout], on_cpu.tensors + [on_cpu.dout]):
        assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize("options", [dict(causal=True), dict(window=(50, 0)), dict(softcap=30.0, sinks=True),
                                     dict(seqlens=[7, 0, 1023], seqlens_k=[113, 5, 1024])],
                         ids=["causal", "window", "softcap-sinks", "varlen"])
def test_flashlab_api_through_check(options):
    options = dict(dict(heads=8, kv_heads=2, head_dim=128, dtype="bf16", seed=3, batch=2, seqlen_q=1023), **options)
    if "seqlens" in options:
        options.pop("batch"), options.pop("seqlen_q")
        function = flashlab.flash_attn_varlen_func
    else:
        function = flashlab.flash_attn_func
    problem = ft.problem(**options)
    ft.check(function, problem, raise_on_failure=True)
    if "seqlens" not in options:
        ft.check_backward(function, problem, raise_on_failure=True)


def test_triton_style_bhsd_sdpa_and_bench():
    problem = ft.problem(batch=2, heads=8, seqlen_q=1024, head_dim=64, dtype="fp16", causal=True, seed=1)

    def sdpa(q, k, v, causal=False, softmax_scale=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale)
    ft.check(sdpa, problem, layout="bhsd", raise_on_failure=True)
    table = ft.bench({"sdpa_math_bhsd": sdpa}, [problem], directions=("fwd", "fwdbwd"), layout="bhsd", warmup=2,
                     iters=5, progress=False)
    names = {row.name for row in table.rows}
    assert {"sdpa_math_bhsd", "sdpa_cudnn", "sdpa_flash", "flashlab"} <= names
    mine = [row for row in table.rows if row.name == "sdpa_math_bhsd"]
    assert all(row.ms and row.ms > 0 and row.tflops > 0 for row in mine)
    assert table.matmul_tflops > 10 and "x" + "sdpa_cudnn" in table.format()
