#!/usr/bin/env bash
# Configures, builds and runs tests/subproject (a project that add_subdirectory()s tensorpool),
# then installs it and checks that tensorpool added no install rules of its own.
# Usage: subproject_test.sh SOURCE_DIR [CMAKE_ARGS...] (generator, compiler, launcher, flags)
set -euo pipefail
source_dir=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

test_name=subproject_test
# shellcheck source=/dev/null
source "$(dirname "$0")/../install/step.sh"

step configure cmake -S "$source_dir/tests/subproject" -B "$work/build" \
  -DTENSORPOOL_SOURCE_DIR="$source_dir" -DTENSORPOOL_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug "$@"
step build cmake --build "$work/build" --target parent
"$work/build/parent"
step install cmake --install "$work/build" --prefix "$work/prefix"
if [ -e "$work/prefix" ] && [ -n "$(find "$work/prefix" -type f | head -1)" ]; then
  echo "subproject_test: installing the parent project installed tensorpool files:" >&2
  find "$work/prefix" -type f | head >&2
  exit 1
fi
echo "subproject_test: built and ran tensorpool as a subproject; it installed nothing"
