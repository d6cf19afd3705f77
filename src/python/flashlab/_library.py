"""Loads the extension, libflashlab_ops.so, which registers the torch operators.

The library holds no Python module: its static initializers register the
flashlab::* schemas and CUDA kernels (TORCH_LIBRARY) when torch.ops.load_library
dlopens it. So it depends on torch's C++ libraries but on no Python ABI, needs
no pybind11, and loading it makes no CUDA call: CUDA starts at the first op.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import torch

LIBRARY_NAME = "libflashlab_ops.so"


def _library_path() -> Path:
    """The extension to load, first found of:

    1. $FLASHLAB_OPS_LIBRARY (make test points it into the build tree);
    2. next to this file (an installed wheel);
    3. where the installed distribution's files say (an editable install keeps
       the sources here and the extension in site-packages).
    """
    override = os.environ.get("FLASHLAB_OPS_LIBRARY")
    if override:
        path = Path(override)
        if not path.is_file():
            raise ImportError(f"FLASHLAB_OPS_LIBRARY={override!r} is not a file")
        return path
    beside = Path(__file__).with_name(LIBRARY_NAME)
    if beside.is_file():
        return beside
    try:
        files = importlib.metadata.distribution("flashlab").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == LIBRARY_NAME:
            path = Path(file.locate())
            if path.is_file():
                return path
    raise ImportError(
        f"flashlab: {LIBRARY_NAME} not found (looked at $FLASHLAB_OPS_LIBRARY, {beside}, and the "
        "installed flashlab distribution's files); install the package with "
        "`pip install --no-build-isolation .`, or set FLASHLAB_OPS_LIBRARY to the build tree's "
        "build/release/python/libflashlab_ops.so")


def load() -> Path:
    path = _library_path()
    torch.ops.load_library(str(path))
    return path


class KernelInfo:
    """One registered kernel: its name, its passes, the registry's summary line, the dtypes it
    takes ("fp16", "bf16", "fp32") and the head dims it has code for (the public API pads any
    smaller head dim up to the next of them)."""

    __slots__ = ("name", "backward", "kvcache", "summary", "dtypes", "head_dims")

    def __init__(self, name: str, backward: bool, kvcache: bool, summary: str,
                 dtypes: tuple = (), head_dims: tuple = ()):
        self.name, self.backward, self.kvcache, self.summary = name, backward, kvcache, summary
        self.dtypes, self.head_dims = tuple(dtypes), tuple(head_dims)

    def runs_head_dim(self, head_dim: int) -> bool:
        """Whether the public API can run head_dim on this kernel (at it, or padded up)."""
        return any(h >= head_dim for h in self.head_dims)

    def __repr__(self) -> str:
        passes = ["forward"] + (["backward"] if self.backward else []) + (["kvcache"] if self.kvcache else [])
        return f"KernelInfo({self.name!r}, {'+'.join(passes)}: {self.summary})"


def read_kernels() -> dict[str, KernelInfo]:
    """The registry, fastest first (the order "auto" tries), from flashlab::kernels."""
    kernels = {}
    for entry in torch.ops.flashlab.kernels():
        name, passes, summary, dtypes, head_dims = entry.split("\t", 4)
        passes = passes.split(",")
        kernels[name] = KernelInfo(name, "backward" in passes, "kvcache" in passes, summary,
                                   tuple(d for d in dtypes.split(",") if d),
                                   tuple(int(h) for h in head_dims.split(",") if h))
    return kernels
