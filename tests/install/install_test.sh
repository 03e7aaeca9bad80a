#!/usr/bin/env bash
# Installs the tensorpool build in BUILD_DIR into a temporary prefix, then configures, builds and
# runs tests/install/consumer against it through find_package(tensorpool). EXPECT_CUDA (ON/OFF)
# says whether the build has tensorpool::cuda, which the consumer must then find and link.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR EXPECT_CUDA [CMAKE_ARGS...] (generator, compiler,
# flags: the consumer is built like the library it links)
set -euo pipefail
build_dir=$1
source_dir=$2
expect_cuda=$3
shift 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

test_name=install_test
# shellcheck source=/dev/null
source "$(dirname "$0")/step.sh"

step install cmake --install "$build_dir" --prefix "$work/prefix"
step configure cmake -S "$source_dir/tests/install/consumer" -B "$work/build" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release "$@"
step build cmake --build "$work/build"
if [[ $expect_cuda == ON ]] && ! grep -q "consumer: tensorpool::cuda found" "$work/configure.log"; then
  echo "install_test: the build has tensorpool::cuda but the installed package does not provide it" >&2
  exit 1
fi
"$work/build/consumer"
[[ $expect_cuda != ON ]] || echo "install_test: consumer_cuda linked against the installed tensorpool::cuda"
