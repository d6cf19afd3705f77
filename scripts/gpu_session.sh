#!/usr/bin/env bash
# One call on a GPU machine: set-up, configure + build (release), the test
# suite, the acceptance run and a benchmark, with logs under $OUT (or ./gpu-logs).
# Usage: scripts/gpu_session.sh [step...]
#   steps: build test run kvcache info trace memory sanitizer debug ncu bench sweep decode
#   (default: all but ncu and decode)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-logs}
mkdir -p "$out"
steps=${*:-build test run kvcache info trace memory sanitizer debug bench sweep}
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
  ctest --preset release -j "$jobs" --timeout 600 -LE sanitizer > "$out/ctest.log" 2>&1 || status=1
  grep -E "tests passed|tests failed|Total Test time|\(Failed\)|\(Timeout\)|Not Run|\(SEGFAULT\)|Exception" "$out/ctest.log" | head -n 40
  ctest --preset release -N -L cpu | tail -n 1; ctest --preset release -N -L gpu | tail -n 1
  echo "ctest: $(( $(date +%s) - start )) s"
fi

if has run; then
  section "flashlab-run acceptance problem"
  # Every registered kernel (the lines before the developer kernels in --list-kernels).
  for kernel in $(build/release/flashlab-run --list-kernels | sed '/^developer kernels/,$d' | cut -f1); do
    build/release/flashlab-run --kernel $kernel --batch 1 --heads 16 --kv-heads 1 --seqlen-q 2048 \
      --seqlen-k 2048 --head-dim 64 --dtype fp16 --causal --layout packed-qkv --seed 2024 --json \
      2>&1 | tee "$out/run_$kernel.log" | tail -n 14
    echo "exit code ${PIPESTATUS[0]}"
  done
fi

if has kvcache; then
  section "kvcache: decoding acceptance problems, the KV-cache GPU tests, compute-sanitizer"
  start=$(date +%s)
  # Decode steps: batch 1 and 8, 32/8 heads, head_dim 128, bf16, an 8k cache with one
  # row appended, paged (pages of 256) and contiguous.
  for problem in "--batch 1 --page-size 256" "--batch 8 --page-size 256" "--batch 1" "--batch 8"; do
    echo "--- $problem"
    build/release/flashlab-run --kvcache --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --seqlen-k 8192 \
      --cache-seqlens 8191 --append 1 --seed 2024 $problem --json 2>&1 | tee "$out/kvcache_${problem// /_}.log" | tail -n 13
    echo "exit code ${PIPESTATUS[0]}"
  done
  # Ragged lengths (random under 8k) with a speculative step (4 query rows, causal, 4 appended).
  build/release/flashlab-run --kvcache --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --seqlen-k 8192 \
    --cache-seqlens random --seqlen-q 4 --causal --append 4 --page-size 256 --seed 7 2>&1 | tail -n 13
  echo "exit code ${PIPESTATUS[0]}"
  build/release/flashlab-run --kvcache --batch 8 --heads 32 --kv-heads 8 --head-dim 128 --dtype bf16 --seqlen-k 8192 \
    --cache-seqlens 8191 --append 1 --page-size 256 --seed 2024 --memory 2>&1 | tail -n 11
  # The KV-cache GPU tests alone (the test step's shards run them too), with their time.
  build/release/tests/flashlab_gpu_tests --gtest_filter='*KvCache*' > "$out/kvcache_tests.log" 2>&1 || status=1
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[  SKIPPED \]|tests? from .* ran" "$out/kvcache_tests.log" | head -n 30
  # compute-sanitizer memcheck, racecheck and synccheck on the KV-cache sanitizer cases (paged
  # pages of 16 with ragged lengths incl. 0, an append across a page boundary, 3 splits; a
  # contiguous one filled to capacity, 2 splits): the sanitizer step's sanitizer_kvcache_* tests.
  ctest --preset release -R '^sanitizer_kvcache_' -j 1 --timeout 600 -V > "$out/kvcache_sanitizer.log" 2>&1 || status=1
  grep -E ": [0-9]+ runs|FAIL |=========  |tests passed|tests failed" "$out/kvcache_sanitizer.log" | sed "s/^[0-9]*: //" | head -n 20
  echo "kvcache: $(( $(date +%s) - start )) s"
fi

if has info; then
  section "flashlab-info"
  build/release/flashlab-info 2>&1 | tee "$out/info.log"
fi

if has trace; then
  section "tile-state diff on the planted bugs, then on the kernels that record tile states"
  build/release/flashlab-run --kernel fa1_scalar_planted_bug --batch 1 --heads 2 --kv-heads 1 \
    --seqlen-q 113 --seqlen-k 203 --head-dim 64 --dtype fp16 --seed 5 --repeat 0 2>&1 | tail -n 9
  for kernel in fa1_scalar_planted_bug fa2_mma_sm80_planted_bug; do
    build/release/flashlab-run --kernel $kernel --batch 1 --heads 2 --kv-heads 1 \
      --seqlen-q 113 --seqlen-k 203 --head-dim 64 --dtype fp16 --seed 5 --trace-tiles 2>&1 | tail -n 6
    echo "exit code ${PIPESTATUS[0]}"
  done
  for kernel in fa1_scalar fa2_mma_sm80 fa3_wgmma_sm90; do
    build/release/flashlab-run --kernel $kernel --batch 1 --heads 2 --kv-heads 1 \
      --seqlen-q 113 --seqlen-k 203 --head-dim 64 --dtype fp16 --seed 5 --trace-tiles 2>&1 | tail -n 3
  done
  # fa2 with one m16 slab per warp (head_dim 256: block_q 64, block_k 32), causal, bf16.
  build/release/flashlab-run --kernel fa2_mma_sm80 --batch 1 --heads 2 --kv-heads 1 --causal \
    --seqlen-q 113 --seqlen-k 203 --head-dim 256 --dtype bf16 --seed 5 --trace-tiles 2>&1 | tail -n 3
fi

if has memory; then
  section "memory: fused kernel against naive attention"
  build/release/flashlab-run --batch 1 --heads 16 --head-dim 64 --dtype fp16 --memory 2>&1 | tail -n 5
fi

if has sanitizer; then
  section "compute-sanitizer"
  start=$(date +%s)
  # One test at a time: on the H100 the forward's racecheck alone takes about 180 s (212 s
  # beside memcheck); then the backward's and the KV-cache path's memcheck, racecheck, synccheck.
  ctest --preset release -L sanitizer -j 1 --timeout 900 -V > "$out/sanitizer.log" 2>&1 || status=1
  grep -E ": [0-9]+ runs|FAIL |=========  |tests passed|tests failed" "$out/sanitizer.log" | sed "s/^[0-9]*: //" | head -n 60
  grep -m 2 "ok   racecheck" "$out/sanitizer.log" | sed 's/^[0-9]*: //'
  echo "sanitizer: $(( $(date +%s) - start )) s"
fi

if has debug; then
  section "debug preset: cuda-gdb breakpoint test"
  start=$(date +%s)
  { cmake --preset debug && cmake --build --preset debug -j "$jobs"; } > "$out/build_debug.log" 2>&1 \
    || { tail -n 40 "$out/build_debug.log"; status=1; }
  ctest --preset debug -L debug -V --timeout 600 > "$out/debug.log" 2>&1 || status=1
  sed 's/^[0-9]*: //' "$out/debug.log" | grep -vE "^(UpdateCTest|Test project|Constructing|Checking|Parse|Add file|Updating|Test command|Working Directory|Environment|Test timeout|test [0-9])" | tail -n 30
  echo "debug: $(( $(date +%s) - start )) s"
fi

if has ncu; then
  section "ncu: fa3_wgmma_sm90 and fa2_mma_sm80 at head_dim 128, 4 x 16 heads x 4096, bf16"
  # One timed launch of each kernel (the third, after warm-up), clocks left alone
  # (METHOD.md). Tensor pipe: wgmma (gmma) for fa3, mma.sync (hmma) for fa2.
  metrics=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
  metrics+=,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  metrics+=,sm__inst_executed_pipe_tensor_op_gmma.sum,launch__registers_per_thread,launch__occupancy_limit_registers
  metrics+=,sm__sass_inst_executed_op_local_ld.sum,sm__sass_inst_executed_op_local_st.sum
  metrics+=,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed
  for spec in "fa3_wgmma_sm90 fa3_forward_kernel" "fa3_wgmma_sm90 fa3_forward_kernel --causal" \
              "fa2_mma_sm80 fa2_forward_kernel"; do
    set -- $spec
    kernel=$1 name=$2; shift 2
    echo "--- $kernel $*"
    timeout 300 ncu --clock-control none --kernel-name "regex:$name" --launch-skip 2 --launch-count 1 \
      --metrics "$metrics" --section WarpStateStats --print-details all \
      build/release/flashlab-run --kernel $kernel --batch 4 --heads 16 --seqlen-q 4096 --seqlen-k 4096 \
      --head-dim 128 --dtype bf16 --seed 11 --repeat 5 "$@" > "$out/ncu_${kernel}$*.log" 2>&1 || status=1
    grep -E "^ +(gpu__time|sm__pipe|sm__inst|launch__reg|launch__occ|sm__sass|dram__|sm__thr|Stall|Warp Cycles|Avg\.|Active)|smsp__pcsamp|stall" \
      "$out/ncu_${kernel}$*.log" | head -n 40
  done
fi

if has bench; then
  section "flashlab-bench"
  build/release/flashlab-bench ${BENCH_ARGS:-} \
    --benchmark_out="$out/bench.json" --benchmark_out_format=json > "$out/bench.log" 2>&1 || status=1
  sed -n '/matmul peak measured/,$p' "$out/bench.log"
fi
if has sweep; then
  section "flashlab-bench --sweep (fa2 tile configurations)"
  build/release/flashlab-bench --sweep --head-dims=64,128 --seqlens=4096 \
    --benchmark_out="$out/sweep.json" --benchmark_out_format=json > "$out/sweep.log" 2>&1 || status=1
  sed -n '/matmul peak measured/,$p' "$out/sweep.log"
fi
if has decode; then
  # Not in the default steps: the KV-cache decoding benchmark (issue 11), DECODE_ARGS passed on
  # (say --cache-lens=8192,131072 --batches=1,32); its table and targets from the JSON.
  section "flashlab-bench --decode (KV-cache decoding: GB/s of K/V against the copy bandwidth)"
  build/release/flashlab-bench --decode ${DECODE_ARGS:-} \
    --benchmark_out="$out/decode.json" --benchmark_out_format=json > "$out/decode.log" 2>&1 || status=1
  sed -n '/^copy bandwidth:/p; /copy bandwidth measured in this run/,$p' "$out/decode.log"
  python3 scripts/bench_table.py --decode "$out/decode.json" || status=1
fi
exit $status
