#!/usr/bin/env bash
# scripts/gpu/prepare-carry.sh: gathers here (Debian 12, with the package registries in reach)
# what a lent GPU machine lacks for scripts/gpu-check.sh, into .gpu-carry/ (gitignored), which
# travels with the working tree when the device tool's `run` names it in `carry`. The GPU
# machine reaches no network, and its image is described as holding CUDA, PyTorch, CMake and
# ninja, not the C++ libraries the build finds with find_package (docs/gpu-validation.md, "On a
# lent machine (the device tool)"); carried, they are used whether or not the image has its own:
#
#   .gpu-carry/deps/    Debian 12's packages of spdlog, fmt, Catch2 (v2), CLI11, nlohmann-json
#                       and Google Benchmark, unpacked (dpkg -x): the prefix deps/usr goes into
#                       CMAKE_PREFIX_PATH there, and its shared libraries into LD_LIBRARY_PATH
#   .gpu-carry/traces/  the shared traces (../shared/traces/*.pickle), for the GPU replays
#   .gpu-carry/commit   the commit this was prepared at (the tree travels without .git)
#   .gpu-carry/whl/     the librmm-cu13 and rapids-logger wheels (RMM's pool in the GPU replay),
#                       when pip reaches PyPI; without them the replay runs without RMM
#
#   scripts/gpu/prepare-carry.sh        (idempotent: what is there already is kept)
# Exit status: 0 when deps/ is complete (the traces and wheels are optional); 1 otherwise.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CARRY=$ROOT/.gpu-carry
PACKAGES=(libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 catch2 libcli11-dev nlohmann-json3-dev
  libbenchmark-dev libbenchmark1debian)
mkdir -p "$CARRY/debs" "$CARRY/deps" || exit 1

missing=()
for p in "${PACKAGES[@]}"; do
  ls "$CARRY/debs/${p}_"*.deb >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  # apt-get download writes into the current directory (as root it warns that _apt cannot).
  if ! (cd "$CARRY/debs" && apt-get download "${missing[@]}") >"$CARRY/apt.log" 2>&1; then
    cat "$CARRY/apt.log" >&2
    echo "prepare-carry: apt-get download ${missing[*]} failed" >&2
    exit 1
  fi
  grep -v '^W: Download is performed unsandboxed' "$CARRY/apt.log"
fi
for deb in "$CARRY"/debs/*.deb; do dpkg -x "$deb" "$CARRY/deps" || exit 1; done
# The libraries' version links (libfmt.so -> libfmt.so.9 -> ...) become copies: whatever carries
# the folder need not keep links.
find "$CARRY/deps" -type l | while read -r link; do
  target=$(readlink -f "$link") && [ -f "$target" ] && cp --remove-destination "$target" "$link"
done
for config in usr/lib/x86_64-linux-gnu/cmake/spdlog/spdlogConfig.cmake usr/lib/x86_64-linux-gnu/cmake/fmt/fmt-config.cmake \
  usr/lib/cmake/Catch2/Catch2Config.cmake usr/share/cmake/CLI11/CLI11Config.cmake \
  usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake usr/lib/x86_64-linux-gnu/cmake/benchmark/benchmarkConfig.cmake; do
  [ -f "$CARRY/deps/$config" ] || { echo "prepare-carry: $config missing from the unpacked packages" >&2; exit 1; }
done
echo "prepare-carry: deps: ${#PACKAGES[@]} packages in $CARRY/deps"

traces=$ROOT/../shared/traces
if ls "$traces"/*.pickle >/dev/null 2>&1; then
  mkdir -p "$CARRY/traces" && cp -u "$traces"/*.pickle "$CARRY/traces/"
  echo "prepare-carry: traces: $(ls "$CARRY/traces" | wc -l) from $traces"
else
  echo "prepare-carry: traces: none ($traces has no .pickle): the GPU replay generates one"
fi

if ! ls "$CARRY"/whl/librmm_cu13-*.whl "$CARRY"/whl/rapids_logger-*.whl >/dev/null 2>&1; then
  mkdir -p "$CARRY/whl"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$CARRY/whl" librmm-cu13 rapids-logger >/dev/null 2>&1 ||
    echo "prepare-carry: wheels: pip could not download librmm-cu13 and rapids-logger: the GPU replay runs without RMM"
fi
ls "$CARRY"/whl/*.whl >/dev/null 2>&1 && echo "prepare-carry: wheels: $(cd "$CARRY/whl" && ls *.whl | tr '\n' ' ')"
# The tree travels without .git: the commit it was prepared at, for gpu-check.sh's record.
git -C "$ROOT" describe --always --dirty --abbrev=40 >"$CARRY/commit" 2>/dev/null && echo "prepare-carry: commit $(cat "$CARRY/commit")"
echo "prepare-carry: $(du -sh "$CARRY" | cut -f1) in $CARRY (the device tool carries at most 64 MiB with the tree)"
