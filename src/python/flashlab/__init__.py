"""flashlab: FlashAttention CUDA kernels as torch operators, with flash-attn's Python API.

    import torch, flashlab
    q, k, v = (torch.randn(2, 1024, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = flashlab.flash_attn_func(q, k, v, causal=True)                 # flash-attn's call
    out = flashlab.flash_attn_func(q, k, v, causal=True, kernel="fa2_mma_sm80")   # one kernel

The operators are torch.ops.flashlab.{fwd, varlen_fwd, bwd, varlen_bwd, fwd_kvcache}
(and kernels, the registry). Importing flashlab loads the extension and makes no
CUDA call.
"""

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
    "kernels",
    "library_path",
]
