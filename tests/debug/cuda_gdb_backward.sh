#!/usr/bin/env bash
# Proves cuda-gdb stepping works in a backward kernel's consumer warpgroup:
# takes the first stop that `flashlab-run --backward --locate` prints for a key
# row owned by the second consumer warpgroup (dK and dV of the row, in
# registers, before the epilogue's store), runs it under cuda-gdb, and checks
# that (a) the thread that stopped is the one --locate names, in consumer
# warpgroup 2 (threads 256..383), and (b) the printed float32 sums round to
# what the kernel stored there (flashlab-run --show-element): within bf16's
# rounding, relative 2^-8.
# Exit 77 (CTest: skipped) without cuda-gdb or a GPU, or, for fa3, an sm_90 GPU.
# Usage: cuda_gdb_backward.sh path/to/flashlab-run <kernel>
set -uo pipefail
source "$(dirname "$0")/cuda_gdb_lib.sh"
run=$1 kernel=$2
gdb=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
[ -x "$gdb" ] || { echo "SKIP: cuda-gdb not found"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "SKIP: no GPU"; exit 77; }
if [ "$kernel" = fa3_wgmma_sm90 ]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1)
  [ "$cc" = "9.0" ] || { echo "SKIP: fa3_wgmma_sm90 needs compute capability 9.0; this GPU has $cc"; exit 77; }
fi

# The problem of .vscode/launch.json's fa3 backward configuration. Key row 200:
# key block 1, row 72 of it, so the second 64-key half of the
# block (consumer warpgroup 2); head 1 of a two-head GQA group.
batch=0 head=1 key_row=200 col=5
problem="--kernel $kernel --batch 1 --heads 2 --kv-heads 1 --seqlen-q 200 --seqlen-k 300 --head-dim 64 --dtype bf16 --seed 7"
located=$("$run" $problem --backward --locate $batch,$head,$key_row,$col) ||
  { echo "FAIL: flashlab-run --locate failed"; echo "$located"; exit 1; }
stop=$(awk '/^stop 1:/{on=1; next} /^stop [0-9]+:/{on=0} on' <<<"$located")
break_line=$(grep -o "break .*" <<<"$stop" | head -n 1)
prints=$(grep -o "print .*" <<<"$stop")
[ -n "$break_line" ] && [ "$(wc -l <<<"$prints")" -eq 2 ] ||
  { echo "FAIL: --locate printed no dK/dV stop"; echo "$located"; exit 1; }
block=$(grep -oE "key block [0-9]+, block \([0-9,]+\)" <<<"$located" | head -n 1 | grep -oE "block \([0-9,]+\)$")
thread=$(grep -oE "dk: thread \([0-9,]+\)" <<<"$located" | head -n 1 | grep -oE "thread \([0-9,]+\)")
thread_x=$(grep -oE "[0-9]+" <<<"$thread" | head -n 1)
[ "$thread_x" -ge 256 ] && [ "$thread_x" -lt 384 ] ||
  { echo "FAIL: --locate put key row $key_row in thread $thread, not in consumer warpgroup 2"; exit 1; }

transcript=$(cuda_gdb_stop "$gdb" "$run" "$problem --backward --repeat 0" "$break_line" "$prints")
cuda_gdb_show "$transcript" 20
values=($(cuda_gdb_values "$transcript"))
[ ${#values[@]} -ge 2 ] || { echo "FAIL: cuda-gdb printed no values"; exit 1; }
stopped=$(cuda_gdb_focus "$transcript")
echo "--locate: $block $thread; cuda-gdb stopped in: $stopped"
[ "$stopped" = "$block $thread" ] ||
  { echo "FAIL: the breakpoint stopped in ${stopped:-nothing}, --locate named $block $thread"; exit 1; }

shown=$("$run" $problem --backward --repeat 0 --show-element $batch,$head,$key_row,$col | grep "^element d[kv]")
echo "$shown"
python3 - "${values[0]}" "${values[1]}" "$shown" <<'PY'
import sys
dk, dv, shown = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3].splitlines()
stored = {line.split("[")[0].split()[-1]: float(line.split("kernel ")[1].split(",")[0]) for line in shown}
ok = True
for name, value in (("dk", dk), ("dv", dv)):
    want = stored.get(name)
    good = want is not None and abs(value - want) <= 2 ** -8 * abs(want) + 1e-6
    ok &= good
    print(f"{'ok' if good else 'WRONG'}: cuda-gdb {name} {value} against the kernel's stored {want}")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
