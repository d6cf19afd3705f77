"""What the Triton example's tests need before they import it: without a CUDA device,
TRITON_INTERPRET=1 (set before triton is imported: the kernels then run on the CPU in
Triton's interpreter, which computes with numpy); with neither triton nor (on the CPU)
numpy, the calling test module is skipped with the reason."""
import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"


def require_triton():
    if not ON_GPU:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
    except ImportError as error:  # CPU-only torch wheels do not bring triton
        pytest.skip(f"triton cannot be imported ({error}); pip install triton", allow_module_level=True)
    if not ON_GPU:
        try:
            import numpy  # noqa: F401
        except ImportError as error:
            pytest.skip(f"numpy cannot be imported ({error}); Triton's CPU interpreter needs it",
                        allow_module_level=True)
