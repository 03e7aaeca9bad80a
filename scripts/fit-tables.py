#!/usr/bin/env python3
"""Does it fit? `tensorpool fit` on every shared trace, and a synthetic suite of real model shapes
replayed against every allocator (utilization, peak reserved and fit side by side).

Usage: scripts/fit-tables.py [TENSORPOOL_BINARY] [TRACES_DIR] [WORK_DIR]
(defaults: build/tools/tensorpool, ../shared/traces and a temporary folder for the generated
traces). Prints the markdown tables of docs/benchmarks.md ("Does it fit?"), built from the --json
output of `tensorpool fit`, `tensorpool compare` and `tensorpool generate`, with each command.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

binary = sys.argv[1] if len(sys.argv) > 1 else "build/tools/tensorpool"
traces = sys.argv[2] if len(sys.argv) > 2 else "../shared/traces"
work = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="tensorpool-fit-")
allocators = ["tensorpool", "tensorpool-vmm", "pytorch", "pytorch-expandable", "cub", "raw"]

# (name, generate arguments, capacity the suite is compared at)
suite = [
    ("Llama-2-7B training, full recompute, ZeRO-3 over 8 ranks",
     ["--model", "llama2-7b", "--checkpointing", "full", "--zero", "3", "--dp", "8", "--micro-batch", "4",
      "--global-batch", "64"], "80GiB"),
    ("GPT-2 1.5B training at high memory pressure (varlen batches on a device 1.4% above their peak requested)",
     ["--model", "gpt2-xl", "--micro-batch", "6", "--global-batch", "60", "--options", "seq_dist:uniform"], "40GiB"),
    ("Mixtral-8x7B training (top-2 of 8 experts, busiest 1.5x the mean; ZeRO-3 over 32 ranks, full recompute)",
     ["--model", "mixtral-8x7b", "--zero", "3", "--dp", "32", "--checkpointing", "full", "--micro-batch", "2",
      "--global-batch", "128", "--options", "moe_imbalance:1.5"], "80GiB"),
    ("Llama-2-13B inference, continuous batching (256 requests, 1 per decode step, up to 64 at once, paged KV)",
     ["--model", "llama2-13b", "--mode", "inference", "--options", "requests:256,max_batch:64,arrival_rate:1"], "80GiB"),
]


def run(args):
    return subprocess.run([binary] + args, check=True, capture_output=True, text=True).stdout


def gib(n):
    return f"{n / 2**30:.3f}"


def fit(path):
    return {a["allocator"]: a for a in json.loads(run(["fit", path, "--json"]))["allocators"]}


def fit_cell(d):
    if not d["fits"]:
        return "none"
    mark = "" if d["verified"] else " (not checked)"
    if not d["monotone"]:
        mark += f" (OOM at {gib(d['oom_above_bytes'])} above)"
    return f"{gib(d['capacity_bytes'])} ({d['ratio_to_peak_requested']:.4f}){mark}"


print(f"Command: `scripts/fit-tables.py {binary} {traces}` (= `tensorpool fit TRACE --json` per trace)\n")
print("Capacity GiB (its ratio to the peak requested), per device; the peak requested is the floor:\n")
print("| trace | device | peak requested GiB | " + " | ".join(allocators) + " |")
print("|---|---|---|" + "---|" * len(allocators))
for path in sorted(glob.glob(os.path.join(traces, "*.pickle"))):
    fits = fit(path)
    devices = fits[allocators[0]]["devices"]
    for i, dev in enumerate(devices):
        cells = [fit_cell(fits[a]["devices"][i]) for a in allocators]
        print(f"| {os.path.basename(path).removesuffix('.pickle')} | {dev['device']} | {gib(dev['peak_requested_bytes'])} | "
              + " | ".join(cells) + " |")
print()

print("Synthetic suite: each trace generated, compared at the capacity shown and fitted:\n")
for name, args, capacity in suite:
    path = os.path.join(work, f"suite-{suite.index((name, args, capacity))}.tptrace")
    subprocess.run([binary, "generate", path] + args, check=True, capture_output=True, text=True)
    compared = json.loads(run(["compare", path, "--capacity", capacity, "--json"]))
    fits = fit(path)
    print(f"**{name}**: `tensorpool generate t.tptrace {' '.join(args)}`, then "
          f"`tensorpool compare t.tptrace --capacity {capacity} --json` and `tensorpool fit t.tptrace --json`\n")
    print(f"| allocator | peak requested GiB | peak reserved GiB | utilization | OOMs at {capacity} | upstream ops | fits GiB (x peak requested) |")
    print("|---|---|---|---|---|---|---|")
    for r in compared["allocators"]:
        f = fits[r["allocator"]]
        cell = fit_cell(f["devices"][0]) if len(f["devices"]) == 1 else gib(f["capacity_bytes"])
        print(f"| {r['allocator']} | {gib(r['peak_requested_bytes'])} | {gib(r['peak_reserved_bytes'])} | "
              f"{r['utilization']:.4f} | {r['ooms']} | {r['upstream_ops']} | {cell} |")
    print()
