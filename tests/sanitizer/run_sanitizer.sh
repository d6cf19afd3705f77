#!/usr/bin/env bash
# compute-sanitizer TOOL over every registered kernel on odd shapes. Fails when
# the tool reports any error in its summary, not only on a non-zero exit.
# Exit 77 (CTest: skipped) when there is no compute-sanitizer or no GPU.
# Usage: run_sanitizer.sh TOOL path/to/flashlab-run
set -uo pipefail
tool=$1 run=$2
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "SKIP: compute-sanitizer not found"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }

shapes=(
  "--batch 1 --heads 2 --kv-heads 2 --seqlen-q 1 --seqlen-k 1"
  "--batch 2 --heads 4 --kv-heads 2 --seqlen-q 7 --seqlen-k 113 --causal"
  "--batch 1 --heads 4 --kv-heads 1 --seqlen-q 113 --seqlen-k 113 --causal --layout packed-qkv"
  "--batch 1 --heads 2 --kv-heads 1 --seqlen-q 113 --seqlen-k 7"
)
failures=0 runs=0
for kernel in $("$run" --list-kernels | cut -f1); do
  for shape in "${shapes[@]}"; do
    for dtype in fp16; do
      runs=$((runs + 1))
      # Only flashlab's own kernels are instrumented (torch's reference kernels are not ours to
      # check), and initcheck skips host-API copies: cuRAND copies its own uninitialized state.
      options=(--tool "$tool" --kernel-name kns=flashlab --error-exitcode 99 --print-limit 10)
      [ "$tool" = initcheck ] && options+=(--check-api-memory-access no)
      log=$("$sanitizer" "${options[@]}" "$run" --kernel "$kernel" $shape \
            --head-dim 64 --dtype "$dtype" --seed 11 --repeat 0 2>&1)
      code=$?
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" <<<"$log" | head -n 2 | tr '\n' ' ')
      if [ $code -eq 2 ]; then  # this kernel does not take this problem (flashlab-run: bad arguments)
        runs=$((runs - 1)); continue
      fi
      # racecheck summarizes as "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
      clean=0
      if [ "$tool" = racecheck ]; then
        grep -qE "RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)" <<<"$log" && clean=1
      else
        grep -q "ERROR SUMMARY: 0 errors" <<<"$log" && clean=1
      fi
      if [ $code -ne 0 ] || [ $clean -ne 1 ]; then
        failures=$((failures + 1))
        echo "FAIL $tool $kernel $shape $dtype (exit $code): $summary"
        grep -E "^========= +(Invalid|Uninitialized|Race|Barrier|Error|Warning|at |by thread|in )|^=========     (at|by|Address|Uninitialized)" <<<"$log" | head -n 12
      else
        echo "ok   $tool $kernel $shape $dtype: $summary"
      fi
    done
  done
done
echo "$tool: $runs runs, $failures with errors"
[ $failures -eq 0 ] && [ $runs -gt 0 ]
