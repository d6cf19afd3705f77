#!/usr/bin/env bash
# One call on a GPU machine: set-up, configure + build (release), the test
# suite, the acceptance run and a benchmark, with logs under $OUT (or ./gpu-logs).
# Usage: scripts/gpu_session.sh [step...]   steps: build test run bench (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-logs}
mkdir -p "$out"
steps=${*:-build test run bench}
jobs=$(nproc)
status=0
has() { [[ " $steps " == *" $1 "* ]]; }
section() { echo; echo "=== $* ==="; }

section "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc --version | tail -n 2 | head -n 1

if has build; then
  section "setup + configure + build ($jobs jobs)"
  scripts/setup.sh && source scripts/env.sh || exit 1
  start=$(date +%s)
  { cmake --preset release && cmake --build --preset release -j "$jobs"; } > "$out/build.log" 2>&1 \
    || { tail -n 60 "$out/build.log"; exit 1; }
  echo "configure + build: $(( $(date +%s) - start )) s"
fi
source scripts/env.sh

if has test; then
  section "ctest"
  start=$(date +%s)
  ctest --preset release -j "$jobs" --timeout 600 > "$out/ctest.log" 2>&1 || status=1
  grep -E "tests passed|tests failed|Total Test time|\(Failed\)|\(Timeout\)|Not Run|\(SEGFAULT\)|Exception" "$out/ctest.log" | head -n 40
  ctest --preset release -N -L cpu | tail -n 1; ctest --preset release -N -L gpu | tail -n 1
  echo "ctest: $(( $(date +%s) - start )) s"
fi

if has run; then
  section "flashlab-run acceptance problem"
  for kernel in fa1_scalar fa2_mma_sm80; do
    build/release/flashlab-run --kernel $kernel --batch 1 --heads 16 --kv-heads 1 --seqlen-q 2048 \
      --seqlen-k 2048 --head-dim 64 --dtype fp16 --causal --layout packed-qkv --seed 2024 --json \
      2>&1 | tee "$out/run_$kernel.log" | tail -n 14
    echo "exit code ${PIPESTATUS[0]}"
  done
fi

if has bench; then
  section "flashlab-bench"
  build/release/flashlab-bench ${BENCH_ARGS:---head-dims=64 --seqlens=1024,4096} \
    --benchmark_out="$out/bench.json" --benchmark_out_format=json > "$out/bench.log" 2>&1 || status=1
  sed -n '/matmul peak measured/,$p' "$out/bench.log"
fi
exit $status
