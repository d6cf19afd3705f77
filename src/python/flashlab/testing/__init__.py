"""flashlab.testing: the harness for attention kernels written in Python (Triton, CuTe DSL, torch).

    import flashlab.testing as ft
    p = ft.problem(batch=2, heads=8, kv_heads=2, seqlen_q=1023, head_dim=64, dtype="bf16", causal=True, seed=1)
    report = ft.check(my_attention, p, tile=(64, 64))   # my_attention(q, k, v, causal=, softmax_scale=)
    print(report)                                       # flashlab-run's report: errors, tolerance, first bad element
    print(ft.bench([my_attention], [p], directions=("fwd", "fwdbwd")))

The problems, the reference, the pass rule and the reports are the C++ harness's (the
extension's flashlab::testing_* operators), so `flashlab-run <p.arguments>` makes the same
inputs bit for bit and reports a registered kernel the same way. From a shell:

    python -m flashlab.testing check examples/triton/flash_attention_triton.py:attention --tile 64x64 --causal
    python -m flashlab.testing bench module:function --seqlen-list 1024,4096 --head-dim 128 --dtype bf16

problem / problem_from_arguments   seeded inputs (flashlab-run's options)
check / check_backward             a function's out (lse) / gradients against the reference: a Report
trace_tiles                        where the kernel's running max/sum first depart (key tile, row, statistic)
run_kernel                         a flashlab kernel (planted-bug ones too) on a problem
bench                              CUDA-event medians beside SDPA cuDNN/FLASH and flashlab: a BenchTable
cases / parametrize                a flash-attn-style case matrix, for pytest (pytest_plugin: fixtures)
"""

from ._bench import BenchTable, bench
from ._cases import Case, cases, parametrize
from ._check import CheckFailed, Report, TraceReport, check, check_backward, run_kernel, trace_tiles
from ._problem import Problem, problem, problem_arguments, problem_from_arguments

__all__ = [
    "BenchTable",
    "Case",
    "CheckFailed",
    "Problem",
    "Report",
    "bench",
    "cases",
    "check",
    "check_backward",
    "parametrize",
    "problem",
    "problem_arguments",
    "problem_from_arguments",
    "run_kernel",
    "trace_tiles",
    "TraceReport",
]
