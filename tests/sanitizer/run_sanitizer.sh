#!/usr/bin/env bash
# compute-sanitizer TOOL over every registered kernel. The forward (default):
# every head dim and both 16-bit dtypes each kernel takes, on small odd shapes;
# --backward: flashlab-run --backward (head dims 64 and 128, one --deterministic)
# for each kernel with a backward; --kvcache: flashlab-run --kvcache (paged and
# contiguous, appends, splits and combine) for each kernel with a KV-cache path.
# The case list comes from the test generators: flashlab_sanitizer_cases [PASS].
# Fails when the tool reports any error in its summary, not only on a non-zero
# exit, when a case fails its check, when there is no case, and when the runs
# take longer than the budget (FLASHLAB_SANITIZER_BUDGET_S, default 180 s; the
# backward pass 300 s: three kernels with a backward since session 21; their 15
# racecheck runs took 159 s alone and 197 s beside the whole GPU ctest on the
# H100; 18 runs since session 22, a tiny deterministic case added; 300 s since
# session 23: with one case per kernel under softcap, ALiBi and sinks the 18
# racecheck runs took 242 s beside the whole GPU ctest; 360 s since session 37:
# one more shape, fa3's 80-row query blocks, three runs more; timed in session 39:
# memcheck 131 s, synccheck 59 s, racecheck 235 s on an H200; then one more, more
# tiles than SMs, three tiny runs, not yet timed).
# Exit 77 (CTest: skipped) when there is no compute-sanitizer or no GPU.
# Usage: run_sanitizer.sh TOOL path/to/flashlab-run path/to/flashlab_sanitizer_cases [--backward|--kvcache]
set -uo pipefail
tool=$1 run=$2 list_cases=$3 pass=${4:-}
label="$tool${pass:+ ${pass#--}}"  # memcheck, memcheck backward, ...
default_budget=180
[ "$pass" = --backward ] && default_budget=360
budget=${FLASHLAB_SANITIZER_BUDGET_S:-$default_budget}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "SKIP: compute-sanitizer not found"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }

# Only the cases this GPU's architecture runs (e.g. sm_90a-only kernels elsewhere).
capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
# shellcheck disable=SC2086  # $pass is empty (the forward) or one flag
cases=$("$list_cases" $pass --compute-capability "$capability") || { echo "FAIL: $list_cases $pass"; exit 1; }
seed=${FLASHLAB_TEST_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "$label: $(grep -c . <<<"$cases") cases for compute capability $capability, seed $seed (FLASHLAB_TEST_SEED=$seed replays)"

failures=0 runs=0 start=$SECONDS
while IFS=$'\t' read -r name arguments; do
  [ -n "$name" ] || continue
  runs=$((runs + 1))
  # Only flashlab's own kernels are instrumented (torch's reference kernels are not ours to
  # check), and initcheck skips host-API copies: cuRAND copies its own uninitialized state.
  options=(--tool "$tool" --kernel-name kns=flashlab --error-exitcode 99 --print-limit 10)
  [ "$tool" = initcheck ] && options+=(--check-api-memory-access no)
  # racecheck (CUDA 13.0) fails cuBLAS's own fp16 GEMM, which the KV-cache reference's shapes reach
  # even with no kernel instrumented: those runs compute the references on the CPU.
  [ "$tool" = racecheck ] && [ "$pass" = --kvcache ] && arguments+=" --cpu-reference"
  # shellcheck disable=SC2086  # the options line is split into words on purpose
  log=$("$sanitizer" "${options[@]}" "$run" $arguments --seed "$seed" --repeat 0 2>&1)
  code=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" <<<"$log" | head -n 2 | tr '\n' ' ')
  # racecheck summarizes as "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
  clean=0
  if [ "$tool" = racecheck ]; then
    grep -qE "RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\)" <<<"$log" && clean=1
  else
    grep -q "ERROR SUMMARY: 0 errors" <<<"$log" && clean=1
  fi
  if [ $code -ne 0 ] || [ $clean -ne 1 ]; then
    failures=$((failures + 1))
    echo "FAIL $tool $name (exit $code): $summary"
    echo "     $run $arguments --seed $seed --repeat 0"
    grep -E "^========= +(Invalid|Uninitialized|Race|Barrier|Error|Warning|at |by thread|in )|^=========     (at|by|Address|Uninitialized)" <<<"$log" | head -n 12
    # A case the kernel rejected, or a mismatch: flashlab-run's own words.
    [ $code -eq 1 ] || [ $code -eq 2 ] && grep -vE "^=========" <<<"$log" | tail -n 6
  else
    echo "ok   $tool $name: $summary"
  fi
done <<<"$cases"
elapsed=$((SECONDS - start))
echo "$label: $runs runs, $failures with errors, ${elapsed} s (budget ${budget} s)"
if [ "$elapsed" -gt "$budget" ]; then
  echo "FAIL $label: ${elapsed} s is over the ${budget} s budget: make the cases in flashlab_sanitizer_cases${pass:+ $pass} smaller or fewer"
  exit 1
fi
[ $failures -eq 0 ] && [ $runs -gt 0 ]
