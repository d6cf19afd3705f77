"""pytest fixtures for flashlab.testing; enable with `pytest_plugins = ["flashlab.testing.pytest_plugin"]`
in a conftest.py (or `pytest -p flashlab.testing.pytest_plugin`).

    flashlab_check           check(fn, problem, ...) that fails the test with the report
    flashlab_check_backward  the same for gradients

With flashlab.testing.parametrize(...) on the test, a failure prints flashlab-run's report
(the first bad element by batch/head/row/column and tile) and the command that repeats it.
"""

import pytest

from ._check import check, check_backward


@pytest.fixture
def flashlab_check():
    def run(fn, problem, **options):
        return check(fn, problem, raise_on_failure=True, **options)
    return run


@pytest.fixture
def flashlab_check_backward():
    def run(fn, problem, **options):
        return check_backward(fn, problem, raise_on_failure=True, **options)
    return run
