#!/usr/bin/env bash
# Installs the Debian packages tensorpool builds with, only those missing. Idempotent.
# `install-deps.sh clang` adds clang and its sanitizer/libFuzzer runtime (the asan preset: `make
# test-asan`, `make fuzz`; `fuzz` is another name for it);
# `install-deps.sh report` adds Chromium, in which the test report_browser renders reports (the
# test is skipped without it: `make test` does not need it).
# `install-deps.sh torch` adds python3-venv and PyTorch from PyPI in the project's virtual
# environment .venv-torch (about 3 GB with its CUDA wheels, a few minutes), with which `make test`
# runs the tests that need torch (tests/python/test_capture.py, test_loop_rules.py; skipped
# without it). .ci/run does this.
set -euo pipefail
pkgs=(cmake ninja-build g++ make python3 libspdlog-dev libfmt-dev catch2 libbenchmark-dev
      libcli11-dev nlohmann-json3-dev)
case "${1:-}" in clang | fuzz) pkgs+=(clang libclang-rt-14-dev) ;; esac
[ "${1:-}" = "report" ] && pkgs+=(chromium)
[ "${1:-}" = "torch" ] && pkgs+=(python3-venv python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

torch_venv() {  # .venv-torch next to this script's project, with torch importable
  local venv
  venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-torch"
  "$venv/bin/python" -c "import torch" 2>/dev/null && return 0
  echo "install-deps: installing torch from PyPI into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check torch numpy
  "$venv/bin/python" -c "import torch; print('install-deps: torch', torch.__version__)"
}

if [ ${#missing[@]} -eq 0 ]; then
  [ "${1:-}" = "torch" ] && torch_venv
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[ "${1:-}" = "torch" ] && torch_venv
exit 0
