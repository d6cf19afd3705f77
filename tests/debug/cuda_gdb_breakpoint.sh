#!/usr/bin/env bash
# Proves cuda-gdb stepping works on a kernel: stops (debug build, -G) at the
# line that records a row's online-softmax state after a chosen key tile
# (the line after the comment "cuda-gdb: the online-softmax state"), prints the
# running max m and running sum l the kernel is about to store, and checks both
# against what the harness computes for that row and tile in float64
# (flashlab-run --trace-tiles --show-state).
#   fa1_scalar      one thread per row: focus block (0,0,0) thread (row,0,0).
#   fa2_mma_sm80    inside the traced instantiation (--trace-tiles): the
#                   condition names the row, tile, batch and head, and cuda-gdb's
#                   focus is the thread that hit it (the quad leader, lane
#                   4 * (row % 8), that owns the row).
#   fa3_wgmma_sm90  the same, inside a consumer warpgroup.
# For fa2 and fa3 the thread that stopped must be the one
# `flashlab-run --locate B,H,ROW` names for the row (block and thread).
# Exit 77 (CTest: skipped) without cuda-gdb or a GPU (or, for fa3, an sm_90 GPU).
# Usage: cuda_gdb_breakpoint.sh path/to/flashlab-run <kernel> path/to/kernel_source.cuh
set -uo pipefail
source "$(dirname "$0")/cuda_gdb_lib.sh"
run=$1 kernel=$2 source=$3
gdb=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
[ -x "$gdb" ] || { echo "SKIP: cuda-gdb not found"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }

line=$(grep -n "cuda-gdb: the online-softmax state" "$source" | cut -d: -f1)
[ -n "$line" ] || { echo "FAIL: no 'cuda-gdb: the online-softmax state' marker in $source"; exit 1; }
line=$((line + 1))
gdb_flags=""
case $kernel in
  fa1_scalar)
    row=3 tile=1 head=0
    # The same program and arguments as .vscode/launch.json.
    problem="--kernel fa1_scalar --batch 1 --heads 2 --kv-heads 1 --seqlen-q 70 --seqlen-k 45 --head-dim 32 --dtype fp16 --seed 7 --repeat 0"
    condition="key_tile == $tile && threadIdx.x == $row && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0"
    focus="cuda block (0,0,0) thread ($row,0,0)"
    prints=$'print key_tile\nprint running_max\nprint running_sum' ;;
  fa2_mma_sm80)
    # head_dim 64: block_q 128 (row 3: warp 0, lane 12), block_k 128, so 300
    # keys make key tiles 0, 1, 2; tile 1 is the middle one.
    # The state is recorded by the traced instantiation (--trace-tiles) only.
    row=3 tile=1 head=1 gdb_flags="--trace-tiles"
    problem="--kernel fa2_mma_sm80 --batch 1 --heads 2 --kv-heads 1 --seqlen-q 200 --seqlen-k 300 --head-dim 64 --dtype fp16 --seed 7 --repeat 0"
    condition="tile == $tile && row == $row && batch == 0 && head == $head"
    focus="cuda kernel block thread"
    prints=$'print tile\nprint running_max\nprint running_sum' ;;
  fa3_wgmma_sm90)
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1)
    [ "$cc" = "9.0" ] || { echo "SKIP: fa3_wgmma_sm90 needs compute capability 9.0; this GPU has $cc"; exit 77; }
    # Row 3 of head 1 lives in consumer warpgroup 0; 300 keys make three
    # 128-key tiles, visited 2, 1, 0: tile 1 is the middle step.
    # The state lives in the traced instantiation (--trace-tiles), never in the timed one.
    row=3 tile=1 head=1 gdb_flags="--trace-tiles"
    problem="--kernel fa3_wgmma_sm90 --batch 1 --heads 2 --kv-heads 1 --seqlen-q 200 --seqlen-k 300 --head-dim 64 --dtype bf16 --seed 7 --repeat 0"
    condition="tile == $tile && row == $row && batch == 0 && head == $head"
    focus="cuda kernel block thread"
    prints=$'print tile\nprint running_max\nprint running_sum' ;;
  *) echo "FAIL: no cuda-gdb case for kernel '$kernel' (cases: fa1_scalar, fa2_mma_sm80, fa3_wgmma_sm90)"; exit 1 ;;
esac

transcript=$(cuda_gdb_stop "$gdb" "$run" "$problem $gdb_flags" "break $(basename "$source"):$line if $condition" \
             "$focus"$'\n'"$prints")
cuda_gdb_show "$transcript"
values=($(cuda_gdb_values "$transcript"))
if [ ${#values[@]} -lt 3 ]; then echo "FAIL: cuda-gdb printed no values"; exit 1; fi
if [ "$kernel" != fa1_scalar ]; then
  located=$("$run" $problem --locate 0,$head,$row | grep -o "expect block ([0-9,]*) thread ([0-9,]*)" | head -n 1)
  located=${located#expect }
  stopped=$(cuda_gdb_focus "$transcript")
  echo "--locate: $located; cuda-gdb stopped in: $stopped"
  [ -n "$located" ] && [ "$located" = "$stopped" ] ||
    { echo "FAIL: the breakpoint stopped in $stopped, --locate named ${located:-nothing}"; exit 1; }
fi
expected=$("$run" $problem --trace-tiles --show-state 0,$head,$row,$tile | grep "expected state")
echo "harness: $expected"
echo "cuda-gdb: tile ${values[0]} running_max ${values[1]} running_sum ${values[2]}"
python3 - "${values[0]}" "${values[1]}" "${values[2]}" "$expected" "$tile" <<'PY'
import sys
tile, m, l, expected, want_tile = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(), int(sys.argv[5])
m_ref, l_ref = float(expected[expected.index("m") + 1]), float(expected[expected.index("l") + 1])
# m and l in float32 against float64: m within 1e-4, l within 1e-3 (the diff's tolerance), relative.
m_ok = abs(m - m_ref) <= 1e-4 * (1 + abs(m_ref))
l_ok = abs(l - l_ref) <= 1e-3 * (1 + abs(l_ref))
ok = tile == want_tile and m_ok and l_ok
print(("PASS" if ok else "FAIL") + f": key tile {tile} (want {want_tile}), running max {m} vs harness {m_ref} "
      f"({'ok' if m_ok else 'WRONG'}), running sum {l} vs harness {l_ref} ({'ok' if l_ok else 'WRONG'})")
sys.exit(0 if ok else 1)
PY
