#!/usr/bin/env bash
# scripts/check-cmake-latest.sh: configures tensorpool with the newest CMake on PyPI (pip's
# `cmake`, in .venv-cmake), as two kinds of hosts do where the system's CMake is not the one
# used: a wheel built by scikit-build-core, which takes CMake from PyPI where the system has none
# at least 3.25, and the lent GPU machines, whose image has CMake from pip. Configure only (the
# CMake version changes how the build is described, not how it compiles), in two
# configurations: every part on with the CUDA backends and their real-GPU tests (where nvcc is
# installed), and the wheel's (pyproject.toml: self-contained, tools only, no install rules).
#
#   scripts/check-cmake-latest.sh         exit 0: both configure; 1: one fails (its log printed)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=$ROOT/.venv-cmake
if [ ! -x "$VENV/bin/cmake" ]; then
  python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install --quiet --upgrade cmake ninja ||
    { echo "check-cmake-latest: pip could not install cmake from PyPI" >&2; exit 1; }
else
  "$VENV/bin/python" -m pip install --quiet --upgrade cmake ninja >/dev/null 2>&1 || true  # offline: the one there
fi
CMAKE=$VENV/bin/cmake
echo "check-cmake-latest: $("$CMAKE" --version | head -n 1)"
NVCC=$(command -v nvcc || { [ -x /usr/local/cuda/bin/nvcc ] && echo /usr/local/cuda/bin/nvcc; } || true)
CUDA_ARGS=(-DTENSORPOOL_CUDA=OFF)
[ -n "$NVCC" ] && CUDA_ARGS=(-DTENSORPOOL_CUDA=ON -DTENSORPOOL_CUDA_REAL_TESTS=ON -DTENSORPOOL_GPU_BENCH=ON
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
configure() {  # configure NAME ARGS...
  local name=$1
  shift
  if "$CMAKE" -S "$ROOT" -B "$work/$name" -G Ninja -DCMAKE_MAKE_PROGRAM="$VENV/bin/ninja" \
    -DCMAKE_BUILD_TYPE=Release "$@" >"$work/$name.log" 2>&1; then
    echo "check-cmake-latest: $name: configured ($(grep -c 'CMake Warning' "$work/$name.log") warnings)"
  else
    echo "check-cmake-latest: $name: FAILED"
    cat "$work/$name.log"
    status=1
  fi
}
configure everything -DTENSORPOOL_BUILD_TESTS=ON -DTENSORPOOL_BUILD_TOOLS=ON -DTENSORPOOL_BUILD_BENCH=ON "${CUDA_ARGS[@]}"
configure wheel -DTENSORPOOL_BUILD_TESTS=OFF -DTENSORPOOL_BUILD_BENCH=OFF -DTENSORPOOL_BUILD_TOOLS=ON \
  -DTENSORPOOL_INSTALL=OFF -DTENSORPOOL_SELF_CONTAINED=ON "${CUDA_ARGS[@]:0:1}"
exit "$status"
