#!/usr/bin/env bash
# scripts/gpu/device-run.sh: the one command to give a lent GPU machine (the device tool's `run`:
# `bash scripts/gpu/device-run.sh`, with `carry: [".gpu-carry"]` made by
# scripts/gpu/prepare-carry.sh). It points the build at what
# .gpu-carry holds (the C++ dependencies, the traces, RMM's wheels), runs scripts/gpu-check.sh
# into a scratch folder, and leaves in OUT_DIR what the tool brings back (at most 8 files):
#
#   summary.txt          gpu-check.sh's summary: a line per step, RESULT last
#   gpu-check.tar.gz     everything gpu-check.sh wrote (docs/gpu-validation.md, "What the
#                        results look like"), for scripts/bench-tables.py and the docs
#
#   scripts/gpu/device-run.sh [OUT_DIR]      (default: $OUT, the device tool's folder)
# Exit status: gpu-check.sh's (0 passed, 1 a test failed, 2 configure or build failed); 64 for
# bad usage. Environment: as gpu-check.sh's (TP_GPU_CHECK_BUDGET, default 480 s, and the rest).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-${OUT:-}}
if [ -z "$DEST" ] || [ $# -gt 1 ]; then
  echo "usage: $0 [OUT_DIR]   (OUT_DIR defaults to \$OUT)" >&2
  exit 64
fi
mkdir -p "$DEST" || exit 64
CARRY=$ROOT/.gpu-carry
if [ -d "$CARRY/deps/usr" ]; then
  # find_package() looks under each prefix of CMAKE_PREFIX_PATH (the environment variable too);
  # the libraries' own dependencies (libspdlog's libfmt) are found at run time through the path.
  export CMAKE_PREFIX_PATH="$CARRY/deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$CARRY/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "device-run: no $CARRY/deps (scripts/gpu/prepare-carry.sh): the build needs the libraries installed" >&2
fi
if [ -z "${TP_GPU_TRACES:-}" ] && ls "$CARRY"/traces/*.pickle >/dev/null 2>&1; then
  export TP_GPU_TRACES=$CARRY/traces
fi
[ -z "${TP_GPU_COMMIT:-}" ] && [ -s "$CARRY/commit" ] && export TP_GPU_COMMIT="$(cat "$CARRY/commit") (prepared; the tree may have moved since)"
work=$(mktemp -d)
bash "$ROOT/scripts/gpu-check.sh" "$work/gpu-check"
rc=$?
cp "$work/gpu-check/summary.txt" "$DEST/summary.txt" 2>/dev/null
tar -czf "$DEST/gpu-check.tar.gz" -C "$work" gpu-check
echo "device-run: exit $rc; $(du -h "$DEST/gpu-check.tar.gz" | cut -f1) in $DEST/gpu-check.tar.gz"
rm -rf "$work"
exit "$rc"
