"""pytest for ctest (python_cpu, python_gpu): runs pytest with these arguments in
this Python, or says pytest is missing (a line the ctest reads as skipped). The
__main__ guard matters: tests that spawn processes (test_distributed_*.py,
torch.multiprocessing) re-import the main module in each child."""
import sys


def main():
    try:
        import pytest
    except ImportError:
        print(f"flashlab: pytest is not installed for {sys.executable}; skipping the Python tests "
              "(scripts/setup.sh installs it where a package index is reachable)")
        return 0
    return pytest.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
