#!/usr/bin/env python3
"""Runs `tensorpool compare --json` over every shared trace and prints markdown tables.

Usage: scripts/compare-shared.py [TENSORPOOL_BINARY] [TRACES_DIR]
(defaults: build/tools/tensorpool and ../shared/traces). The output is what docs/benchmarks.md
holds under "Shared traces".
"""
import glob
import json
import os
import subprocess
import sys

binary = sys.argv[1] if len(sys.argv) > 1 else "build/tools/tensorpool"
traces = sys.argv[2] if len(sys.argv) > 2 else "../shared/traces"
allocators = "tensorpool,tensorpool-vmm,pytorch,pytorch-expandable,cub,rmm-pool,rmm-arena,raw"


def gib(n):
    return f"{n / 2**30:.3f}"


def row(name, r):
    ops = r["upstream_allocs"] + r["upstream_frees"] + r["maps"] + r["unmaps"]
    return (f"| {name} | {gib(r['peak_requested_bytes'])} | {gib(r['peak_reserved_bytes'])} | "
            f"{r['utilization']:.4f} | {gib(r['reserved_at_requested_peak_bytes'])} | "
            f"{r['upstream_allocs']} | {r['upstream_frees']} | {r['maps']} | {r['unmaps']} | {ops} | "
            f"{r['seeding_upstream_ops']} | "
            f"{r['syncs']} | {r['ooms']} | {r['modelled_upstream_ns'] / 1e6:.2f} |")


print(f"Command: `scripts/compare-shared.py {binary} {traces}` "
      f"(= `tensorpool compare TRACE --allocators {allocators} --json` per trace)\n")
for path in sorted(glob.glob(os.path.join(traces, "*.pickle"))):
    out = subprocess.run([binary, "compare", path, "--allocators", allocators, "--json"],
                         check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    print(f"### {os.path.basename(path)}\n")
    print("| allocator | peak requested GiB | peak reserved GiB | utilization | reserved at requested peak GiB "
          "| seg/page creates | seg/page frees | maps | unmaps | upstream ops | start-state ops | syncs | OOMs | modelled upstream ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    if j["recorded"]:
        print(row("PyTorch (actual)", j["recorded"]))
    for r in j["allocators"]:
        print(row(r["allocator"], r))
    print()
