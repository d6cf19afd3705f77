"""bench: attention functions timed beside SDPA's cuDNN and FLASH backends and flashlab."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ._check import _name_of
from ._problem import Problem

DIRECTIONS = ("fwd", "fwdbwd")
BASELINES = ("sdpa_cudnn", "sdpa_flash", "flashlab")


@dataclass
class BenchRow:
    problem: str
    seqlen_q: int
    seqlen_k: int
    direction: str
    name: str
    ms: Optional[float]          # median; None when it did not run (see error)
    tflops: Optional[float]
    matmul_fraction: Optional[float]  # of the matmul rate measured in the same run
    error: Optional[str] = None


@dataclass
class BenchTable:
    rows: List[BenchRow]
    matmul_tflops: float
    device: str
    torch_version: str

    def ratio(self, row: BenchRow, baseline: str) -> Optional[float]:
        """baseline's time / row's time on the same problem and direction (> 1: row is faster)."""
        for other in self.rows:
            if (other.problem, other.direction, other.name) == (row.problem, row.direction, baseline):
                if other.ms and row.ms:
                    return other.ms / row.ms
        return None

    def format(self) -> str:
        lines = [f"{self.device}, torch {self.torch_version}; matmul rate measured in this run "
                 f"{self.matmul_tflops:.1f} TFLOP/s (fp16/bf16 GEMM 8192^3)"]
        header = (f"{'problem':<58} {'dir':<6} {'implementation':<28} {'ms':>9} {'TFLOP/s':>8} {'%mm':>5} "
                  + " ".join(f"{'x' + b:>12}" for b in BASELINES))
        lines += [header, "-" * len(header)]
        for row in self.rows:
            if row.ms is None:
                lines.append(f"{row.problem:<58} {row.direction:<6} {row.name:<28} {'-':>9}  {row.error}")
                continue
            ratios = [self.ratio(row, b) for b in BASELINES]
            lines.append(f"{row.problem:<58} {row.direction:<6} {row.name:<28} {row.ms:9.3f} {row.tflops:8.1f} "
                         f"{100 * row.matmul_fraction:4.0f}% "
                         + " ".join(f"{r:12.2f}" if r else f"{'-':>12}" for r in ratios))
        lines.append("x<baseline>: the baseline's median time / this row's (above 1: faster than the baseline)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()

    def to_json(self) -> str:
        return json.dumps({"device": self.device, "torch": self.torch_version, "matmul_tflops": self.matmul_tflops,
                           "rows": [asdict(r) for r in self.rows]}, indent=1)

    def plot(self, path: str) -> None:
        """TFLOP/s against seqlen_k, a panel per direction, a line per implementation."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as error:
            raise RuntimeError("flashlab.testing: plotting needs matplotlib (pip install matplotlib)") from error
        directions = sorted({r.direction for r in self.rows})
        figure, axes = plt.subplots(1, len(directions), figsize=(6 * len(directions), 4.5), squeeze=False)
        for axis, direction in zip(axes[0], directions):
            for name in dict.fromkeys(r.name for r in self.rows):
                points = sorted((r.seqlen_k, r.tflops) for r in self.rows
                                if r.direction == direction and r.name == name and r.tflops)
                if points:
                    axis.plot(*zip(*points), marker="o", label=name,
                              linestyle="--" if name.startswith("sdpa") else "-")
            axis.axhline(self.matmul_tflops, color="black", linewidth=0.8, linestyle=":", label="matmul rate")
            axis.set_xscale("log", base=2)
            axis.set_xlabel("seqlen")
            axis.set_ylabel("TFLOP/s")
            axis.set_title(direction)
            axis.legend(fontsize=7)
        figure.suptitle(f"flashlab.testing.bench on {self.device}")
        figure.tight_layout()
        figure.savefig(path, dpi=120)


class _Timer:
    """CUDA events around each call, the L2 flushed before it (a 256 MiB write), medians."""

    def __init__(self, device: torch.device, warmup: int, iters: int, flush_l2: bool):
        self.device, self.warmup, self.iters = device, warmup, iters
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if flush_l2 else None

    def median_ms(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iters):
            if self.flush is not None:
                self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def _matmul_tflops(timer: _Timer, dtype: torch.dtype) -> float:
    n = 8192
    dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
    a = torch.randn(n, n, device=timer.device, dtype=dtype)
    b = torch.randn(n, n, device=timer.device, dtype=dtype)
    return 2 * n ** 3 / timer.median_ms(lambda: a @ b) / 1e9


def _sdpa(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_flash": SDPBackend.FLASH_ATTENTION}[backend_name]

    def run(q, k, v, causal=False, softmax_scale=None, **unsupported):
        if unsupported:
            raise NotImplementedError(f"SDPA takes no {', '.join(unsupported)}")
        if causal and q.shape[1] != k.shape[1]:
            raise NotImplementedError("SDPA's is_causal is top-left aligned; flash-attn's (bottom-right) "
                                      "differs when seqlen_q != seqlen_k")
        with sdpa_kernel([backend]):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, scale=softmax_scale,
                enable_gqa=q.shape[2] != k.shape[2])
        return out.transpose(1, 2)

    run.__qualname__ = run.__name__ = backend_name
    return run


def _flashlab(kernel: str = "auto"):
    """flashlab.flash_attn_func (flash_attn_varlen_func for varlen problems) with `kernel`."""
    import flashlab

    def run(q, k, v, *varlen, **kwargs):
        function = flashlab.flash_attn_varlen_func if varlen else flashlab.flash_attn_func
        return function(q, k, v, *varlen, kernel=kernel, **kwargs)

    return run


def _baseline(name: str):
    if name in ("sdpa_cudnn", "sdpa_flash"):
        return _sdpa(name)
    if name == "flashlab":
        return _flashlab()
    if name.startswith("flashlab:"):
        import flashlab
        kernel = name.split(":", 1)[1]
        if kernel not in flashlab.kernels():
            raise ValueError(f"flashlab.testing.bench: {name}: no kernel of that name; registered: "
                             f"{', '.join(flashlab.kernels())}")
        return _flashlab(kernel)
    raise ValueError(f"flashlab.testing.bench: baseline {name!r}; accepted: {', '.join(BASELINES)} or "
                     "flashlab:<kernel> (a registered kernel, flashlab.kernels())")


def _timed_call(fn, problem: Problem, direction: str, layout: str):
    """A closure running fn once on the problem (forward, or forward + backward)."""
    positional, keywords = problem.call_arguments()
    if layout == "bhsd":
        positional[:3] = [x.transpose(1, 2) for x in positional[:3]]
    if direction == "fwd":
        return lambda: fn(*positional, **keywords)
    leaves = [x.detach().clone().requires_grad_() for x in positional[:3]]
    dout = problem.dout if layout == "bshd" else problem.dout.transpose(1, 2)

    def forward_backward():
        result = fn(*leaves, *positional[3:], **keywords)
        out = result[0] if isinstance(result, (tuple, list)) else result
        torch.autograd.backward(out, dout)
        for leaf in leaves:
            leaf.grad = None
    return forward_backward


def bench(fns, problems: Sequence[Problem], directions: Sequence[str] = ("fwd",),
          baselines: Sequence[str] = BASELINES, warmup: int = 10, iters: int = 30, flush_l2: bool = True,
          layout: str = "bshd", progress: bool = True) -> BenchTable:
    """Times each function (a callable with check's signature, a list of them, or a dict
    name -> callable) on each problem, forward ("fwd") and forward + backward ("fwdbwd"),
    beside SDPA pinned to cuDNN and to FLASH (FlashAttention-2) and flashlab.flash_attn_func
    ("flashlab": kernel="auto", fa3_wgmma_sm90 on an H100; "flashlab:<kernel>" names one),
    all in the same run: CUDA events, the L2 flushed before every call, `warmup` calls, the
    median of `iters`. TFLOP/s counts flashlab-bench's FLOPs (4 b h sq sk d, halved for
    causal; fwd+bwd 3.5x) and %mm is the fraction of the fp16/bf16 matmul rate measured in
    this run. A baseline that cannot run a problem (SDPA with softcap, say) gets its reason
    in the table. Needs a CUDA device."""
    if not torch.cuda.is_available():
        raise RuntimeError("flashlab.testing.bench needs a CUDA device: timings on the CPU say nothing "
                           "about a GPU kernel (check() runs on the CPU)")
    for direction in directions:
        if direction not in DIRECTIONS:
            raise ValueError(f"flashlab.testing.bench: direction {direction!r}; accepted: {', '.join(DIRECTIONS)}")
    if callable(fns):
        fns = [fns]
    named: Dict[str, Callable] = dict(fns) if isinstance(fns, dict) else {_name_of(f): f for f in fns}
    implementations = [(name, fn, layout) for name, fn in named.items()]
    implementations += [(b, _baseline(b), "bshd") for b in baselines]
    device = problems[0].device
    timer = _Timer(device, warmup, iters, flush_l2)
    table = BenchTable([], _matmul_tflops(timer, problems[0].dtype), torch.cuda.get_device_name(device),
                       torch.__version__)
    for problem in problems:
        for direction in directions:
            flops = torch.ops.flashlab.testing_flops(problem.arguments, direction)
            for name, fn, fn_layout in implementations:
                row = BenchRow(problem.describe(), problem.info["seqlen_q"], problem.info["seqlen_k"], direction,
                               name, None, None, None)
                try:
                    row.ms = timer.median_ms(_timed_call(fn, problem, direction, fn_layout))
                    row.tflops = flops / row.ms / 1e9
                    row.matmul_fraction = row.tflops / table.matmul_tflops
                except Exception as error:  # noqa: BLE001  (a baseline that cannot run this problem)
                    row.error = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                table.rows.append(row)
                if progress:
                    done = f"{row.ms:.3f} ms, {row.tflops:.1f} TFLOP/s" if row.ms else row.error
                    print(f"[bench] {problem.describe()} {direction} {name}: {done}", flush=True)
    return table
