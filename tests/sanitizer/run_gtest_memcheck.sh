#!/usr/bin/env bash
# compute-sanitizer memcheck over GPU tests (flashlab's kernels only): fails on
# any error in the summary, a failing test or a non-zero exit. Exit 77 (CTest:
# skipped) without compute-sanitizer or a GPU.
# Usage: run_gtest_memcheck.sh path/to/flashlab_gpu_tests GTEST_FILTER
set -uo pipefail
tests=$1 filter=$2
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "SKIP: compute-sanitizer not found"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
log=$("$sanitizer" --tool memcheck --kernel-name kns=flashlab --error-exitcode 99 --print-limit 10 \
      "$tests" --gtest_filter="$filter" 2>&1)
code=$?
grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|tests? from .* ran|ERROR SUMMARY|flashlab test seed" <<<"$log"
if [ $code -ne 0 ] || ! grep -q "ERROR SUMMARY: 0 errors" <<<"$log" || ! grep -q "^\[  PASSED  \]" <<<"$log"; then
  grep -E "^========= +(Invalid|Error|at |by thread)|Failure|Expected|Which is" <<<"$log" | head -n 30
  echo "FAIL memcheck $filter (exit $code)"
  exit 1
fi
echo "ok   memcheck $filter"
