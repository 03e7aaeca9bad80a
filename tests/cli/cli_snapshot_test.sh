#!/usr/bin/env bash
# The CLI on a real PyTorch snapshot of ../shared/traces; exit 77 (skipped) when it is absent.
# Usage: cli_snapshot_test.sh TENSORPOOL_BINARY SHARED_TRACES_DIR
set -u
bin=$1
shared=$2
if [ ! -f "$shared/small-from-empty.pickle" ]; then
  echo "skipped: no shared traces at $shared"
  exit 77
fi
source "$(dirname "$0")/check.sh"

check "info on a PyTorch snapshot" 0 "recorded allocator" -- "$bin" info "$shared/small-from-empty.pickle"
check "compare shows PyTorch's actual" 0 "pytorch-actual" -- "$bin" compare "$shared/small-from-empty.pickle"
check "convert a snapshot" 0 "wrote" -- "$bin" convert "$shared/small-from-empty.pickle" "$work/s.tptrace"
check "the converted snapshot keeps PyTorch's figures" 0 "pytorch-actual" -- "$bin" compare "$work/s.tptrace"
check "fit on a PyTorch snapshot" 0 "yes" -- "$bin" fit "$shared/small-from-empty.pickle"

finish
