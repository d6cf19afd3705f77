#!/usr/bin/env bash
# Compile-only check of every C++ translation unit (src/**/*.cpp, tests/**/*.cpp; no .cu) against
# another torch's headers, so that version-specific breakage (a missing transitive include, an
# ATen op whose signature changed) shows up here instead of on the GPU machine. Local builds use
# the .venv's torch (2.14); the GPU machine has 2.11.0+cu130. Get 2.11's headers without a GPU:
#   pip download --no-deps torch==2.11.0 -d /tmp/torch211
#   unzip -q /tmp/torch211/torch-2.11.0-*.whl 'torch/include/*' -d /tmp/torch211/site
#   scripts/check_torch_headers.sh /tmp/torch211/site/torch/include
# Flags are those of the CMake build (build/release/compile_commands.json), torch's swapped for
# the argument's; g++ -fsyntax-only, JOBS (default 2) at a time (all 42 files: ~6 min on 2 cores).
# Further arguments: check only those files (paths from the repo root). Exit status: failures.
set -u
TORCH_INC=${1:?usage: $0 <torch include root, e.g. /tmp/torch211/site/torch/include>}
[ -f "$TORCH_INC/torch/csrc/api/include/torch/version.h" ] || { echo "no torch headers under $TORCH_INC" >&2; exit 99; }
cd "$(dirname "$0")/.."
ROOT=$PWD
LOG=${TMPDIR:-/tmp}/check_torch_headers.$$; mkdir -p "$LOG"
CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/targets/x86_64-linux/include
FLAGS="-std=gnu++20 -fsyntax-only -DNDEBUG -DGTEST_HAS_PTHREAD=1 -DUSE_C10D_GLOO -DUSE_C10D_NCCL
  -DUSE_DISTRIBUTED -DUSE_NVSHMEM -DUSE_RPC -DUSE_TENSORPIPE
  -I$ROOT/include -I$ROOT/src/kernels -I$ROOT/tests -isystem $CUDA_INC -isystem $CUDA_INC/cccl
  -isystem $TORCH_INC -isystem $TORCH_INC/torch/csrc/api/include"
for d in "$ROOT"/.venv/lib/python3*/site-packages/nvidia/cu13/include; do [ -d "$d" ] && FLAGS+=" -isystem $d"; done
echo "torch $(cat "$TORCH_INC"/torch/{headeronly,csrc/api/include/torch}/version.h 2>/dev/null | grep -A1 'define TORCH_VERSION ' | grep -o '"[^"]*"' | head -1) headers from $TORCH_INC"
export FLAGS LOG
shift; { [ $# -gt 0 ] && printf '%s\n' "$@" || find src tests -name '*.cpp' | sort; } | xargs -P "${JOBS:-2}" -I{} sh -c \
  'if ${CXX:-g++} $FLAGS {} >"$LOG/$(echo {} | tr / _).log" 2>&1; then echo "ok   {}"; else echo "FAIL {}"; fi' \
  | tee "$LOG/summary"
FAILED=$(grep -c '^FAIL' "$LOG/summary")
for f in $(grep '^FAIL' "$LOG/summary" | cut -c6-); do
  echo "=== $f"; grep -E 'error|required from here' "$LOG/$(echo "$f" | tr / _).log" | head -20
done
echo "$FAILED of $(wc -l <"$LOG/summary") failed; logs in $LOG"
exit "$FAILED"
