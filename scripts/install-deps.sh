#!/usr/bin/env bash
# Installs the Debian packages tensorpool builds with, only those missing. Idempotent.
# `install-deps.sh clang` adds clang and its sanitizer/libFuzzer runtime (the asan preset: `make
# test-asan`, `make fuzz`; `fuzz` is another name for it);
# `install-deps.sh report` adds Chromium, in which the test report_browser renders reports (the
# test is skipped without it: `make test` does not need it).
set -euo pipefail
pkgs=(cmake ninja-build g++ make python3 libspdlog-dev libfmt-dev catch2 libbenchmark-dev
      libcli11-dev nlohmann-json3-dev)
case "${1:-}" in clang | fuzz) pkgs+=(clang libclang-rt-14-dev) ;; esac
[ "${1:-}" = "report" ] && pkgs+=(chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
