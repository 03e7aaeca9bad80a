#!/usr/bin/env python3
"""tests/python/test_capture_real_run.py: the capture of a script written as the CS336 medium
run was (tests/python/cs336_train.py) against the real snapshot of that run
(../shared/traces/cs336-medium-seq128-train.pickle): the peak of live requested bytes in a
later training step (the window starts with the weights and both moments live), within 3%, as
published (autocast bf16) and as the trace shows it ran (fp32). Prints the capture's time per
step.

    tests/python/test_capture_real_run.py TENSORPOOL_CLI SHARED_TRACES_DIR

Exits 77 (skipped) without torch (as test_capture.py) or without the shared trace.
"""
import json
import os
import subprocess
import sys
import time

CLI = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/tools/tensorpool")
TRACES = sys.argv[2] if len(sys.argv) > 2 else "../shared/traces"
HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(TRACES, "cs336-medium-seq128-train.pickle")

from torch_here import torch  # noqa: E402,F401 (runs the test where torch is, or skips it)
if not os.path.isfile(REAL):
    print(f"skipped: {REAL} is absent (the shared traces)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))
from tensorpool import capture  # noqa: E402


def peak_from_step(events, step):
    """The peak of live bytes from optimizer step `step` on (after `step` iteration events)."""
    live, now, peak, seen = {}, 0, 0, 0
    for op, addr, size, _, _ in events:
        if op == "iteration":
            seen += 1
        elif op == "alloc":
            live[addr] = size
            now += size
        elif op == "free_requested":
            now -= live.pop(addr)
        if seen >= step:
            peak = max(peak, now)
    return peak


def main():
    info = subprocess.run([CLI, "info", REAL, "--json"], capture_output=True, text=True, check=True)
    real = json.loads(info.stdout)["peak_requested_bytes"]
    script = os.path.join(HERE, "cs336_train.py")
    failed = False
    for precision in ("autocast-bf16", "fp32"):
        start = time.perf_counter()
        result = capture.run_script(script, ["--precision", precision], steps=2)
        seconds = time.perf_counter() - start
        peak = peak_from_step(result.events, 1)  # the second step: a later step, as the window
        error = peak / real - 1.0
        print(f"{precision}: captured peak of the second step {peak:,} bytes against the real run's {real:,} "
              f"({100 * error:+.2f}%); {result.allocations} allocations, {seconds:.1f} s for 2 steps")
        failed = failed or abs(error) > 0.03
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
