"""check / check_backward: a user's attention function against the harness's reference."""

from __future__ import annotations

import inspect
import json
import math
from functools import partial
from typing import Callable, Optional, Tuple

import torch

from ._problem import Problem


class CheckFailed(AssertionError):
    """A check that did not pass; str() is the report."""


class Report:
    """What flashlab-run prints for a check, from the same C++ code: `text` (str(report)),
    `data` (the JSON object, as flashlab-run --json prints it), `passed`."""

    def __init__(self, text: str, data_json: str, problem: Problem, direction: str):
        self.text = text
        self.data = json.loads(data_json)
        self.problem = problem
        self.direction = direction

    @property
    def passed(self) -> bool:
        return bool(self.data["passed"])

    def tensor(self, name: str) -> Optional[dict]:
        """One tensor's comparison ("out", "lse", "dq", "dk", "dv", "dsinks") as a dict:
        max_abs_err, tolerance, first_bad {batch, row, head, col, query_tile, key_tiles, ...}.
        The forward's report holds out (and lse fields prefixed lse_)."""
        if "tensors" in self.data:
            return self.data["tensors"].get(name)
        if name == "out":
            return self.data
        return None

    @property
    def first_bad(self) -> Optional[dict]:
        """The first element over the tolerance in the first tensor that failed, with its name."""
        if "tensors" in self.data:
            for name, tensor in self.data["tensors"].items():
                if tensor and tensor.get("first_bad"):
                    return dict(tensor["first_bad"], tensor=name)
            return None
        for name, key in (("out", "first_bad"), ("lse", "lse_first_bad")):
            if self.data.get(key):
                return dict(self.data[key], tensor=name)
        return None

    def to_json(self) -> str:
        return json.dumps(dict(self.data, direction=self.direction, command=self.problem.command()))

    def assert_passed(self) -> "Report":
        if not self.passed:
            raise CheckFailed("\n" + self.text + f"inputs: {self.problem.command()}"
                              + (" --backward" if self.direction == "backward" else "")
                              + "  (flashlab-run makes the same q, k, v)")
        return self

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Report({'PASSED' if self.passed else 'FAILED'}, {self.problem.describe()})"


def _name_of(fn) -> str:
    if isinstance(fn, str):
        return fn
    if isinstance(fn, partial):
        return _name_of(fn.func)
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{module}.{name}" if module and module != "__main__" else name


def _poison_allocator(like, device: torch.device):
    """Leaves NaN in the CUDA caching allocator's free blocks of these (shape, dtype) sizes,
    so an output the function allocates with torch.empty most likely starts as NaN, and an
    element it never writes fails (the CPU allocator keeps no blocks: there only an `out`
    argument is poisoned)."""
    if device.type != "cuda":
        return
    blocks = [torch.full(shape, float("nan"), dtype=dtype, device=device) for shape, dtype in like]
    del blocks


def _accepts(fn, name: str, through_var_keyword: bool = True) -> bool:
    """Whether fn takes the keyword `name`: a parameter of that name, or (when
    through_var_keyword) a **kwargs it may forward."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or (through_var_keyword and any(p.kind == p.VAR_KEYWORD
                                                              for p in parameters.values()))


def _tile(tile) -> Tuple[int, int]:
    """(block_m, block_n) as the report names tiles: both > 0, or (0, 0) for no tiles."""
    if not (isinstance(tile, (tuple, list)) and len(tile) == 2 and all(isinstance(t, int) for t in tile)):
        raise ValueError(f"flashlab.testing: tile {tile!r}; expected (block_m, block_n), two integers")
    block_m, block_n = tile
    if (block_m, block_n) != (0, 0) and not (0 < block_m < 2 ** 31 and 0 < block_n < 2 ** 31):
        raise ValueError(f"flashlab.testing: tile {tile!r}; expected block_m and block_n > 0 (your kernel's "
                         "tiles), or (0, 0) for a report without tiles")
    return block_m, block_n


def _lse_shape(problem: Problem):
    if problem.varlen:
        return (problem.q.shape[1], problem.q.shape[0])
    return (problem.q.shape[0], problem.q.shape[2], problem.q.shape[1])


def _bhsd(x):
    return x.transpose(1, 2)


def _run(fn, problem: Problem, q, k, v, layout: str, sinks=None):
    """Calls fn as `check` documents; returns (out (batch, seqlen, heads, d), lse or None)."""
    if layout not in ("bshd", "bhsd"):
        raise ValueError(f"flashlab.testing: layout {layout!r}; accepted: 'bshd' (flash-attn's (batch, seqlen, "
                         "heads, head_dim)), 'bhsd' ((batch, heads, seqlen, head_dim), as SDPA and Triton's "
                         "tutorial take)")
    if layout == "bhsd" and problem.varlen:
        raise ValueError("flashlab.testing: layout 'bhsd' takes fixed-length problems; a varlen problem's rows "
                         "are packed (total, heads, head_dim)")
    positional, keywords = problem.call_arguments()
    positional[:3] = [q, k, v] if layout == "bshd" else [_bhsd(q), _bhsd(k), _bhsd(v)]
    if sinks is not None:
        keywords["sinks"] = sinks
    out_shape = positional[0].shape
    _poison_allocator([(out_shape, problem.dtype), (_lse_shape(problem), torch.float32),
                       (out_shape, torch.float32)], problem.device)
    given_out = None
    if _accepts(fn, "out", through_var_keyword=False):
        given_out = keywords["out"] = torch.full(out_shape, float("nan"), dtype=problem.dtype,
                                                 device=problem.device)
    result = fn(*positional, **keywords)
    if result is None and given_out is not None:  # wrote into out= and returned nothing
        result = given_out
    if isinstance(result, (tuple, list)):
        out = result[0] if len(result) > 0 else None
        lse = result[1] if len(result) > 1 and isinstance(result[1], torch.Tensor) else None
    else:
        out, lse = result, None
    if not isinstance(out, torch.Tensor):
        returned = type(result).__name__ if not isinstance(result, (tuple, list)) else \
            f"a {type(result).__name__} whose first entry is {type(out).__name__}"
        raise TypeError(f"flashlab.testing: {_name_of(fn)} returned {returned}; expected out, or (out, lse, ...) "
                        "with out a tensor")
    if layout == "bhsd":
        out = _bhsd(out)
    return out, lse


def _lse_natural(lse, lse_units: str):
    if lse is None:
        return None
    if lse_units == "natural":
        return lse
    if lse_units == "log2":
        return lse.float() * math.log(2.0)
    raise ValueError(f"flashlab.testing: lse_units {lse_units!r}; accepted: 'natural', 'log2'")


def check(fn: Callable, problem: Problem, tile: Tuple[int, int] = (0, 0), name: Optional[str] = None,
          layout: str = "bshd", lse_units: str = "natural", raise_on_failure: bool = False) -> Report:
    """Runs fn on the problem's inputs and compares its output with the reference under the
    project's pass rule (at most twice torch's same-precision math error, plus flash-attn's
    atol), as flashlab-run does for a registered kernel: the report names the largest error,
    the tolerance and why, the first bad element (batch, row, head, column) and, with `tile`
    = (block_m, block_n) of your kernel, its query tile and the key tiles that row visits,
    and where a NaN/inf came from.

    fn takes flash-attn's arguments: fn(q, k, v, causal=, softmax_scale=) (plus window_size,
    softcap, alibi_slopes, sinks when the problem has them; varlen problems add
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k after v) and returns out or
    (out, lse, ...). q (batch, seqlen, heads, head_dim) unless layout="bhsd" (then q, k, v
    and out are (batch, heads, seqlen, head_dim) views). lse (batch, heads, seqlen_q) float,
    natural log unless lse_units="log2"; without it only out is compared. Outputs are
    poisoned: fn's `out` argument if it has one, else NaN left in the CUDA allocator's
    blocks of the output's size, so unwritten elements fail."""
    tile = _tile(tile)
    if isinstance(fn, str):  # a flashlab kernel by name, through the harness's run step
        out, lse = run_kernel(fn, problem)
    else:
        out, lse = _run(fn, problem, *_copies(problem), layout)
        lse = _lse_natural(lse, lse_units)
    if problem.device.type == "cuda":
        torch.cuda.synchronize(problem.device)
    text, data = torch.ops.flashlab.testing_check(problem.arguments, problem.tensors, out.detach(),
                                                  None if lse is None else lse.detach(), name or _name_of(fn),
                                                  *tile)
    report = Report(text, data, problem, "forward")
    return report.assert_passed() if raise_on_failure else report


def _copies(problem: Problem, requires_grad: bool = False):
    """q, k, v for the user's function: copies with the problem's strides (packed-qkv stays
    three views of one buffer), so the reference's inputs stay as drawn whatever the
    function writes; with requires_grad, also a function giving dq, dk, dv after the
    backward, None for one that received no gradient."""
    q, k, v = problem.q, problem.k, problem.v
    if problem.info["layout"] != "packed-qkv":
        copies = [x.detach().clone().requires_grad_(requires_grad) for x in (q, k, v)]
        return (copies, lambda: [x.grad for x in copies]) if requires_grad else copies
    buffer = q._base.detach().clone().requires_grad_(requires_grad)
    views = [torch.as_strided(buffer, x.shape, x.stride(), x.storage_offset()) for x in (q, k, v)]
    if not requires_grad:
        return views
    # The views are not leaves: hooks record which of them a gradient reached.
    reached = [False, False, False]
    for index, view in enumerate(views):
        view.register_hook(lambda grad, index=index: reached.__setitem__(index, True))

    def gradients():
        if buffer.grad is None:
            return [None, None, None]
        return [torch.as_strided(buffer.grad, x.shape, x.stride(), x.storage_offset()) if got else None
                for x, got in zip((q, k, v), reached)]
    return views, gradients


def _autograd_run(fn, problem: Problem, layout: str):
    (q, k, v), gradients_of = _copies(problem, requires_grad=True)
    sinks = problem.sinks.detach().clone().requires_grad_() if problem.sinks is not None else None
    out, lse = _run(fn, problem, q, k, v, layout, sinks=sinks)
    if out.grad_fn is None:
        raise TypeError("flashlab.testing.check_backward: the function's output has no grad_fn; it needs a "
                        "differentiable function (an autograd.Function, or torch operations on q, k, v)")
    _poison_allocator([(x.shape, x.dtype) for x in (problem.q, problem.k, problem.v)], problem.device)
    out.backward(problem.dout)
    nan_like = lambda x: torch.full_like(x, float("nan"))  # noqa: E731
    dq, dk, dv = [g if g is not None else nan_like(x) for g, x in zip(gradients_of(), (q, k, v))]
    dsinks = None
    if sinks is not None:
        dsinks = sinks.grad if sinks.grad is not None else nan_like(sinks)
    return out, lse, dq, dk, dv, dsinks


def check_backward(fn: Callable, problem: Problem, tile: Tuple[int, int] = (0, 0), name: Optional[str] = None,
                   layout: str = "bshd", lse_units: str = "natural", raise_on_failure: bool = False) -> Report:
    """check for the gradients: fn as for check, differentiable (an autograd.Function or
    torch code); out.backward(problem.dout) gives dq, dk, dv (and dsinks with sinks), each
    compared with autograd through the float32 (float64 for fp32) reference under the
    gradients' rule (three times torch's same-precision error, plus the atol). A gradient fn
    never produces is NaN in the report. The report names the first bad element of each
    tensor, key rows for dk/dv with the query tiles that touch them."""
    tile = _tile(tile)
    if isinstance(fn, str):  # a flashlab kernel by name, through the harness's run steps
        out, lse, dq, dk, dv, dsinks = run_kernel(fn, problem, backward=True)
    else:
        out, lse, dq, dk, dv, dsinks = _autograd_run(fn, problem, layout)
        lse = _lse_natural(lse, lse_units)
    if problem.device.type == "cuda":
        torch.cuda.synchronize(problem.device)
    text, data = torch.ops.flashlab.testing_check_backward(
        problem.arguments, problem.tensors, problem.dout, out.detach(), None if lse is None else lse.detach(),
        dq, dk, dv, dsinks, name or _name_of(fn), *tile)
    report = Report(text, data, problem, "backward")
    return report.assert_passed() if raise_on_failure else report


class TraceReport:
    """The tile-state diff, as flashlab-run --trace-tiles prints it: `text`, `data` (JSON),
    `matches`, and `first_difference` {key_tile, batch, head, row, statistic ("m": running
    max, "l": running sum), kernel, expected}."""

    def __init__(self, text: str, data_json: str, problem: Problem):
        self.text, self.data, self.problem = text, json.loads(data_json), problem

    @property
    def matches(self) -> bool:
        return bool(self.data["matches"])

    @property
    def first_difference(self) -> Optional[dict]:
        return self.data["first_difference"]

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"TraceReport({'matches' if self.matches else 'differs'}, {self.problem.describe()})"


def trace_tiles(fn: Callable, problem: Problem, tile: Tuple[int, int], name: Optional[str] = None,
                layout: str = "bshd", descending: bool = False) -> TraceReport:
    """Where a kernel's online softmax first departs, by key tile, row and statistic: fn is
    called as check calls it plus tile_trace=(row_max, row_sum), two float32 tensors
    (batch, heads, seqlen_q, key tiles of tile[1] keys) into which the kernel writes, after
    each key tile t, each row's running max m (natural-log units of the scaled scores, -inf
    before any visible key) and running sum l (the sum of exp(score - m)) at
    [batch, head, row, t]. The harness recomputes the states in float64 with the same tiling
    (descending: the key tiles are visited last first) and names the first key tile where
    any row departs, a wrong m before a wrong l (flashlab-run --trace-tiles for a CUDA
    kernel). States the kernel never writes (tiles it skips) are not compared."""
    tile = _tile(tile)
    if tile == (0, 0):
        raise ValueError("flashlab.testing.trace_tiles: needs tile=(block_m, block_n), the kernel's tiles")
    row_max, row_sum = torch.ops.flashlab.testing_trace_buffers(problem.arguments, problem.q, tile[1])
    if not _accepts(fn, "tile_trace"):
        raise TypeError(f"flashlab.testing.trace_tiles: {_name_of(fn)} takes no tile_trace argument; the kernel "
                        "records its states into tile_trace=(row_max, row_sum) (see trace_tiles' docstring)")
    _run(partial(fn, tile_trace=(row_max, row_sum)), problem, *_copies(problem), layout)
    if problem.device.type == "cuda":
        torch.cuda.synchronize(problem.device)
    text, data = torch.ops.flashlab.testing_trace_report(problem.arguments, problem.tensors, row_max, row_sum,
                                                         name or _name_of(fn), *tile, bool(descending))
    return TraceReport(text, data, problem)


def run_kernel(kernel: str, problem: Problem, backward: bool = False):
    """A flashlab kernel, registered or a developer one (fa2_mma_sm80_planted_bug, ...), on the
    problem's inputs through the harness's own run step (outputs poisoned with NaN): (out,
    lse), or with backward (out, lse, dq, dk, dv, dsinks or None). check(kernel_name, problem)
    uses it. For comparing a kernel with yours on the
    same inputs, and for checking that flashlab-run and check agree."""
    if problem.device.type != "cuda":
        raise ValueError(f"flashlab.testing.run_kernel: {kernel} runs on the GPU; the problem is on "
                         f"{problem.device} (make it with device='cuda')")
    tensors = torch.ops.flashlab.testing_run_kernel(problem.arguments, kernel, backward, problem.device)
    if not backward:
        return tuple(tensors)
    return tuple(tensors[:5]) + (tensors[5] if problem.sinks is not None else None,)
