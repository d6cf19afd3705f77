"""Seeded problems: flashlab-run's problem options, its inputs (cuRAND MT19937), bitwise."""

from __future__ import annotations

import json
import random
import shlex
from dataclasses import dataclass, field
from typing import Optional, Sequence, Tuple

import torch

import flashlab  # noqa: F401  (loads the extension: torch.ops.flashlab.testing_*)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def _dtype_name(dtype) -> str:
    if isinstance(dtype, str):
        name = _DTYPE_ALIASES.get(dtype, dtype)
        if name not in DTYPES:
            raise ValueError(f"flashlab.testing: dtype {dtype!r}; accepted: {', '.join(DTYPES)} (or float32, "
                             "float16, bfloat16, torch.float32, torch.float16, torch.bfloat16)")
        return name
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"flashlab.testing: dtype {dtype}; accepted: torch.float32, torch.float16, torch.bfloat16")
    return _DTYPE_NAMES[dtype]


def default_device() -> torch.device:
    """The current CUDA device when there is one, else the CPU (the inputs are the same)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def problem_arguments(batch: Optional[int] = None, heads: int = 8, kv_heads: Optional[int] = None,
                      seqlen_q: Optional[int] = None, seqlen_k: Optional[int] = None, head_dim: int = 64,
                      dtype="fp16", causal: bool = False, window: Optional[Tuple[int, int]] = None,
                      softmax_scale: Optional[float] = None, seed: Optional[int] = None, layout: str = "bshd",
                      seqlens: Optional[Sequence[int]] = None, seqlens_k: Optional[Sequence[int]] = None,
                      softcap: float = 0.0, alibi: Optional[str] = None, sinks: bool = False,
                      float64_reference: bool = False) -> list:
    """flashlab-run's problem options for these keywords (a fresh seed when none is given,
    as flashlab-run picks one: it is in the options, so a report can be repeated). A fixed
    length batch defaults to batch 2, seqlen_q 113 (flashlab-run's defaults)."""
    if seed is None:
        seed = random.randrange(1_000_000)
    arguments = ["--heads", str(heads), "--head-dim", str(head_dim), "--dtype", _dtype_name(dtype),
                 "--seed", str(seed), "--layout", layout]
    # Given keywords become options, so flashlab-run's parser rejects what does not go
    # together (seqlens with batch or seqlen_q, seqlens_k without seqlens).
    for option, value in (("--batch", batch), ("--seqlen-q", seqlen_q), ("--seqlen-k", seqlen_k)):
        if value is not None:
            arguments += [option, str(value)]
    for option, lengths in (("--seqlens", seqlens), ("--seqlens-k", seqlens_k)):
        if lengths is not None:
            arguments += [option, ",".join(str(n) for n in lengths)]
    if float64_reference:
        arguments.append("--float64-reference")
    if kv_heads is not None:
        arguments += ["--kv-heads", str(kv_heads)]
    if causal:
        arguments.append("--causal")
    if window is not None:
        if not (isinstance(window, (tuple, list)) and len(window) == 2):
            raise ValueError(f"flashlab.testing: window {window!r}; expected (left, right), -1 for unbounded")
        left, right = window
        arguments += ["--window-left", str(left), "--window-right", str(right)]
    if softmax_scale is not None:
        arguments += ["--softmax-scale", repr(float(softmax_scale))]
    if softcap:
        arguments += ["--softcap", repr(float(softcap))]
    if alibi is not None:
        arguments += ["--alibi", alibi]
    if sinks:
        arguments.append("--sinks")
    return arguments


@dataclass
class Problem:
    """One seeded attention problem: `arguments` are flashlab-run's options for it (so
    `flashlab-run <arguments>` makes the same q, k, v, bit for bit), the tensors on `device`.

    q (batch, seqlen_q, heads, head_dim), k and v (batch, seqlen_k, kv_heads, head_dim), or
    packed (total, heads, head_dim) with cu_seqlens_q/k for a varlen problem; alibi_slopes
    and sinks (float32) when the problem has them; dout like q (the backward's upstream
    gradient, its own MT19937 stream, drawn when first asked for: on the CPU cuRAND's host
    generator takes seconds to seed)."""
    arguments: list
    info: dict
    tensors: list  # as the harness returns them: q, k, v, cu_seqlens_q/k, alibi_slopes, sinks (empty: absent)
    device: torch.device = field(default_factory=default_device)
    _dout: Optional[torch.Tensor] = None

    def _tensor(self, index: int) -> Optional[torch.Tensor]:
        tensor = self.tensors[index]
        return tensor if tensor.numel() > 0 else None

    @property
    def q(self) -> torch.Tensor:
        return self.tensors[0]

    @property
    def k(self) -> torch.Tensor:
        return self.tensors[1]

    @property
    def v(self) -> torch.Tensor:
        return self.tensors[2]

    @property
    def cu_seqlens_q(self) -> Optional[torch.Tensor]:
        return self._tensor(3) if self.varlen else None

    @property
    def cu_seqlens_k(self) -> Optional[torch.Tensor]:
        return self._tensor(4) if self.varlen else None

    @property
    def alibi_slopes(self) -> Optional[torch.Tensor]:
        return self._tensor(5)

    @property
    def sinks(self) -> Optional[torch.Tensor]:
        return self._tensor(6)

    @property
    def dout(self) -> torch.Tensor:
        if self._dout is None:
            self._dout = torch.ops.flashlab.testing_dout(self.arguments, self.q)
        return self._dout

    # What the problem is (resolved: defaults filled in, the softmax scale the kernels use).
    @property
    def causal(self) -> bool:
        return self.info["causal"]

    @property
    def softmax_scale(self) -> float:
        return self.info["softmax_scale"]

    @property
    def window_size(self) -> Tuple[int, int]:
        return (self.info["window_left"], self.info["window_right"])

    @property
    def varlen(self) -> bool:
        return self.info["varlen"]

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.info["dtype"]]

    @property
    def seed(self) -> int:
        return self.info["seed"]

    def describe(self) -> str:
        return self.info["describe"]

    def command(self, tool: str = "flashlab-run") -> str:
        """The flashlab-run command line that makes this problem."""
        return " ".join([tool] + [shlex.quote(a) for a in self.arguments])

    def call_arguments(self):
        """(positional, keyword) arguments for a function with flash-attn's signature:
        flash_attn_func(q, k, v, **kw), or for varlen flash_attn_varlen_func(q, k, v,
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kw). Keywords: causal,
        softmax_scale, and window_size / softcap / alibi_slopes / sinks only when the
        problem has them (so a function without them still takes the plain problems)."""
        positional = [self.q, self.k, self.v]
        # Copies of what a function could write into (the reference reads the problem's own).
        if self.varlen:
            positional += [self.cu_seqlens_q.clone(), self.cu_seqlens_k.clone(), self.info["max_seqlen_q"],
                           self.info["max_seqlen_k"]]
        keywords = {"causal": self.causal, "softmax_scale": self.softmax_scale}
        if self.window_size != (-1, -1):
            keywords["window_size"] = self.window_size
        if self.info["softcap"]:
            keywords["softcap"] = self.info["softcap"]
        if self.alibi_slopes is not None:
            keywords["alibi_slopes"] = self.alibi_slopes.clone()
        if self.sinks is not None:
            keywords["sinks"] = self.sinks.clone()
        return positional, keywords

    def __repr__(self) -> str:
        return f"Problem({self.describe()} on {self.device})"


def problem_from_arguments(arguments: Sequence[str], device=None) -> Problem:
    """The problem flashlab-run's options describe (["--batch", "2", "--causal", ...]); errors
    name the option as flashlab-run does. A fresh seed is added when none is given."""
    arguments = [str(a) for a in arguments]
    if not any(a == "--seed" or a.startswith("--seed=") for a in arguments):
        arguments += ["--seed", str(random.randrange(1_000_000))]
    device = torch.device(device) if device is not None else default_device()
    tensors, info = torch.ops.flashlab.testing_problem(arguments, device)
    return Problem(arguments, json.loads(info), list(tensors), device)


def problem(device=None, **options) -> Problem:
    """A seeded problem, as flashlab-run makes it for the same options:

        p = flashlab.testing.problem(batch=2, heads=8, kv_heads=2, seqlen_q=1023, head_dim=64,
                                     dtype="bf16", causal=True, seed=1)

    Keywords (flashlab-run's option in brackets): batch [2], heads, kv_heads [default heads],
    seqlen_q [113], seqlen_k [default seqlen_q], head_dim, dtype ("fp16", "bf16", "fp32" or a
    torch dtype), causal, window=(left, right), softmax_scale [default 1/sqrt(head_dim)], seed
    [default: a fresh one, kept in p.arguments], layout ("bshd" or "packed-qkv": q, k, v views
    of one buffer), seqlens / seqlens_k (a varlen batch, packed rows: instead of batch and
    seqlen_q/k), softcap, alibi ("per-head", "per-batch"), sinks, float64_reference. device: the current CUDA device by default, else the
    CPU (cuRAND's host generator: the same values)."""
    return problem_from_arguments(problem_arguments(**options), device)
