#!/usr/bin/env bash
# compute-sanitizer TOOL over the FP8 forward (issue 36): tests/sanitizer/fp8_cases.py through
# flashlab's Python API, only flashlab's kernels instrumented (the
# forward and its V transpose). Fails when the tool reports any error, when a case fails, or when
# the script does not finish; exit 77 (CTest: skipped) without compute-sanitizer, a GPU or
# compute capability 9.0.
# Usage: run_fp8_sanitizer.sh TOOL PYTHON (PYTHONPATH / FLASHLAB_OPS_LIBRARY from CTest)
set -uo pipefail
tool=$1 python=$2
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "SKIP: compute-sanitizer not found"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
[ "$capability" = 90 ] || { echo "SKIP: the FP8 forward needs compute capability 9.0; got $capability"; exit 77; }
seed=${FLASHLAB_TEST_SEED:-$((RANDOM * 32768 + RANDOM))}
log=$("$sanitizer" --tool "$tool" --kernel-name kns=flashlab --error-exitcode 99 --print-limit 10 \
      "$python" "$(dirname "$0")/fp8_cases.py" "$seed" 2>&1)
code=$?
echo "$log" | grep -vE "^========= +(at|by|in) " | tail -n 20
echo "FP8 $tool, seed $seed (FLASHLAB_TEST_SEED=$seed replays): exit $code"
[ $code -eq 77 ] && exit 77
if [ "$tool" = racecheck ]; then
  grep -qE "RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)" <<<"$log" || exit 1
else
  grep -q "ERROR SUMMARY: 0 errors" <<<"$log" || exit 1
fi
[ $code -eq 0 ] && [ "$(grep -c '^ok ' <<<"$log")" -eq 8 ]
