#!/usr/bin/env bash
# Installs what this machine lacks to build flashlab, and nothing it has:
#  - a Python with a CUDA build of torch: python3's own when it has one (the GPU
#    machine), else a .venv with torch==2.14.1;
#  - CMake >= 3.28 and Ninja: the system's when new enough, else into the .venv;
#  - GoogleTest and Google Benchmark: Debian's libgtest-dev / libbenchmark-dev
#    when their headers are missing;
#  - pytest, numpy (Triton's CPU interpreter for the Triton example's tests) and
#    scikit-build-core (the Python package's tests and build backend).
# Prints what it found. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "setup: $*"; }

has_cuda_torch() {
  "$1" -W ignore -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1
}

version_at_least() {  # version_at_least 3.25.1 3.28
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

# 1. Python with CUDA torch.
if [ -x .venv/bin/python ] && has_cuda_torch .venv/bin/python; then
  python=.venv/bin/python
elif command -v python3 >/dev/null && has_cuda_torch python3; then
  python=$(command -v python3)
else
  log "creating .venv with torch==2.14.1 (CUDA build)"
  python3 -m venv .venv
  .venv/bin/pip install --quiet torch==2.14.1
  python=.venv/bin/python
fi
log "torch $("$python" -W ignore -c 'import torch; print(torch.__version__)') from $python"

# 2. CMake and Ninja.
system_cmake_version=$(cmake --version 2>/dev/null | head -n1 | awk '{print $3}' || true)
if [ -n "$system_cmake_version" ] && version_at_least "$system_cmake_version" 3.28; then
  log "cmake $system_cmake_version (system)"
else
  if [ ! -x .venv/bin/cmake ]; then
    log "system cmake '${system_cmake_version:-none}' is older than 3.28: installing cmake into .venv"
    [ -x .venv/bin/pip ] || python3 -m venv .venv
    .venv/bin/pip install --quiet "cmake>=3.28,<5"
  fi
  log "cmake $(.venv/bin/cmake --version | head -n1 | awk '{print $3}') (.venv)"
fi
if ! command -v ninja >/dev/null && [ ! -x .venv/bin/ninja ]; then
  log "installing ninja into .venv"
  [ -x .venv/bin/pip ] || python3 -m venv .venv
  .venv/bin/pip install --quiet ninja
fi

# 3. GoogleTest and Google Benchmark.
header_present() {
  for prefix in /usr/include /usr/local/include /opt/*/include; do [ -f "$prefix/$1" ] && return 0; done
  return 1
}
missing=()
header_present gtest/gtest.h || missing+=(libgtest-dev)
header_present benchmark/benchmark.h || missing+=(libbenchmark-dev)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]} with apt-get"
  sudo_prefix=""
  [ "$(id -u)" -eq 0 ] || sudo_prefix="sudo"
  $sudo_prefix apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_prefix apt-get install -y -qq "${missing[@]}" >/dev/null
fi
log "GoogleTest and Google Benchmark present"

# Installs a Python package with pip unless `check` (Python code) succeeds:
# python_package NAME CHECK REQUIREMENT WHAT-FAILS-WITHOUT-IT
python_package() {
  if "$python" -c "$2" >/dev/null 2>&1; then
    log "$1 present"
  elif "$python" -m pip install --quiet "$3"; then
    log "installed $1 into $python"
  else
    log "warning: could not install $1 for $python: $4"
  fi
}

# 4. pytest, for the Python package's tests (ctest python_cpu and python_gpu run
#    tests/python against the build tree; without pytest they report skipped), and
#    numpy, for Triton's CPU interpreter: the Triton example's tests (ctest
#    triton_example) run its kernels on the CPU without a GPU; they skip without it.
python_package pytest 'import pytest' pytest "the Python tests will report skipped"
python_package numpy 'import numpy' numpy "the Triton example's CPU tests will report skipped"

# 5. scikit-build-core, the Python package's build backend (pip install / pip wheel
#    --no-build-isolation . build against this Python's torch, so the backend must be here).
python_package scikit-build-core \
  'import scikit_build_core, sys; sys.exit(0 if tuple(map(int, scikit_build_core.__version__.split(".")[:2])) >= (0, 10) else 1)' \
  "scikit-build-core>=0.10" "pip install/wheel --no-build-isolation . will fail"
