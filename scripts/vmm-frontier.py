#!/usr/bin/env python3
"""Utilization against upstream calls for several virtual-memory settings, on every shared trace.

Usage: scripts/vmm-frontier.py [TENSORPOOL_BINARY] [TRACES_DIR]
(defaults: build/tools/tensorpool and ../shared/traces). For each setting, replays every
PyTorch snapshot with `tensorpool compare TRACE --allocators tensorpool-vmm --conf SETTING --json`
and sets it against the `pytorch` and `pytorch-expandable` models on the same trace. Prints the
markdown tables of docs/benchmarks.md ("Growth settings: the trade-off").
"""
import glob
import json
import os
import subprocess
import sys

binary = sys.argv[1] if len(sys.argv) > 1 else "build/tools/tensorpool"
traces = sorted(glob.glob(os.path.join(sys.argv[2] if len(sys.argv) > 2 else "../shared/traces", "*.pickle")))
settings = [
    "",
    "vmm_max_chunk:32MiB",
    "vmm_max_chunk:1GiB",
    "vmm_max_chunk:16GiB",
    "vmm_growth_divisor:64,vmm_max_growth:1GiB,vmm_max_chunk:16GiB",
    "vmm_growth_divisor:32,vmm_max_growth:1GiB,vmm_max_chunk:16GiB",
    "vmm_growth_divisor:16,vmm_max_growth:4GiB,vmm_max_chunk:16GiB",
]


def compare(path, allocators, conf=""):
    cmd = [binary, "compare", path, "--allocators", allocators, "--json"]
    if conf:
        cmd += ["--conf", conf]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["allocator"]: r for r in json.loads(out)["allocators"]}


refs = {t: compare(t, "pytorch,pytorch-expandable") for t in traces}
print(f"Command: `scripts/vmm-frontier.py {binary} {' '.join(sys.argv[2:3]) or '../shared/traces'}`\n")
print("| setting (`--conf`, on top of the defaults) | traces above both PyTorch models in utilization "
      "| lowest utilization | traces with no more ops than `pytorch` | same, counting the start state "
      "| upstream ops, all traces | OOMs |")
print("|---|---|---|---|---|---|---|")
per_trace = {}
for s in settings:
    above = ops_ok = ops_seed_ok = total = ooms = 0
    lowest = 1.0
    for t in traces:
        r = compare(t, "tensorpool-vmm", s)["tensorpool-vmm"]
        pt, pe = refs[t]["pytorch"], refs[t]["pytorch-expandable"]
        per_trace[(s, t)] = r
        above += r["utilization"] > max(pt["utilization"], pe["utilization"])
        ops_ok += r["upstream_ops"] <= pt["upstream_ops"]
        ops_seed_ok += r["upstream_ops_with_seeding"] <= pt["upstream_ops_with_seeding"]
        total += r["upstream_ops"]
        ooms += r["ooms"]
        lowest = min(lowest, r["utilization"])
    n = len(traces)
    print(f"| `{s or '(defaults)'}` | {above} of {n} | {lowest:.4f} | {ops_ok} of {n} | {ops_seed_ok} of {n} | {total} | {ooms} |")

print("\nPer trace (utilization / upstream ops in the window / ops counting the start state; an OOM "
      "means a request was refused, so that utilization is not comparable):\n")
print("| trace | pytorch | pytorch-expandable | " + " | ".join(f"`{s or '(defaults)'}`" for s in settings) + " |")
print("|---|---|---|" + "---|" * len(settings))
for t in traces:
    cell = lambda r: (f"{r['utilization']:.4f} / {r['upstream_ops']} / {r['upstream_ops_with_seeding']}"
                      + (f" ({r['ooms']} OOM)" if r["ooms"] else ""))
    row = [os.path.basename(t).removesuffix(".pickle"), cell(refs[t]["pytorch"]), cell(refs[t]["pytorch-expandable"])]
    row += [cell(per_trace[(s, t)]) for s in settings]
    print("| " + " | ".join(row) + " |")
