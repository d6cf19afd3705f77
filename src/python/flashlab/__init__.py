"""flashlab: FlashAttention CUDA kernels as torch operators, with flash-attn's Python API.

    import torch, flashlab
    q, k, v = (torch.randn(2, 1024, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flashlab.flash_attn_func(q, k, v, causal=True)                 # flash-attn's call
    out = flashlab.flash_attn_func(q, k, v, causal=True, kernel="fa2_mma_sm80")   # one kernel

The operators are torch.ops.flashlab.{fwd, varlen_fwd, bwd, varlen_bwd, fwd_kvcache, fwd_fp8, varlen_fwd_fp8}
(and kernels, the registry; check_errors, set_strict_checks, strict_checks;
merge_attention_states_, the ring's merge; testing_*, flashlab.testing's harness entries).
Importing flashlab loads the extension and makes no CUDA call.

Subpackages: flashlab.testing (check, time and locate bugs in attention kernels written in
Python: Triton, CuTe DSL, torch), flashlab.distributed (ring and Ulysses context
parallelism over torch.distributed) and flashlab.fp8 (e4m3 inputs for the FP8 forward:
quantization with FA3's descale factors, the Hadamard rotation for outlier channels).
"""

import torch

from . import _library

_library_file = _library.load()

from . import _ops  # noqa: E402  (needs the schemas the library registers)

_ops.set_kernels(_library.read_kernels())

from .flash_attn_interface import (  # noqa: E402
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)


def check_errors(device=None):
    """Waits for the GPU (device: an index, a torch.device or None for every device flashlab
    ran on) and raises RuntimeError for the first bad value a kernel met in cu_seqlens,
    cache_seqlens or block_table since the last report (the tensor, the index, the value).
    Without it the next flashlab call on that device raises it."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        device = device.index if device.index is not None else torch.cuda.current_device()
    torch.ops.flashlab.check_errors(device)


def set_strict_checks(on=True):
    """Strict checks: cu_seqlens, cache_seqlens and block_table are copied to the host and
    checked before each launch (a sync per call; skipped while capturing a CUDA graph).
    Returns the previous setting. FLASHLAB_STRICT_CHECKS=1 turns them on at start."""
    return torch.ops.flashlab.set_strict_checks(bool(on))


def strict_checks():
    """Whether strict checks are on (set_strict_checks)."""
    return torch.ops.flashlab.strict_checks()


def kernels():
    """The registered kernels, fastest first (the order kernel="auto" tries): name -> KernelInfo
    (name, backward, kvcache, summary: the registry's line with dtypes and head dims)."""
    return dict(_ops._kernels)


def library_path() -> str:
    """The libflashlab_ops.so this process loaded."""
    return str(_library_file)


__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "check_errors",
    "kernels",
    "library_path",
    "set_strict_checks",
    "strict_checks",
]
