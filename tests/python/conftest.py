"""Shared by the Python tests: they import flashlab from PYTHONPATH (make test
points it at src/python and FLASHLAB_OPS_LIBRARY at the build tree's extension)
or from an installed package."""
import os

import pytest
import torch

# flashlab.testing's fixtures (flashlab_check, flashlab_check_backward), as a user enables them.
pytest_plugins = ["flashlab.testing.pytest_plugin"]

FULL_MATRIX = os.environ.get("FLASHLAB_FULL_MATRIX", "") not in ("", "0")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="no CUDA device (torch.cuda.is_available() is False)")


def pytest_report_header(config):
    import flashlab

    return [f"flashlab extension: {flashlab.library_path()}",
            f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, "
            f"GPU matrix: {'full (FLASHLAB_FULL_MATRIX=1)' if FULL_MATRIX else 'default subset'}"]
