"""pytest for ctest (python_cpu, python_gpu): runs pytest with these arguments in
this Python, or says pytest is missing (a line the ctest reads as skipped)."""
import sys

try:
    import pytest
except ImportError:
    print(f"flashlab: pytest is not installed for {sys.executable}; skipping the Python tests "
          "(scripts/setup.sh installs it where a package index is reachable)")
    sys.exit(0)

sys.exit(pytest.main(sys.argv[1:]))
