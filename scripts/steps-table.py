#!/usr/bin/env python3
"""Steps in the virtual-memory mode, three ways, on generated loops: none (online), the program's
step() at each iteration marker (`--step-at-iterations`), and boundaries found from the requests
(`--conf vmm_find_steps:true`). Prints a Markdown table (docs/benchmarks.md, "Steps found from
the requests").

Usage: scripts/steps-table.py [--tensorpool BIN] [--work DIR] [--capacity 80GiB]

Each loop is made by `tensorpool generate` (LOOPS below) and replayed once with
`tensorpool compare --allocators tensorpool-vmm --json` at the capacity; the figures: utilization
(peak requested / peak reserved), upstream calls and synchronizations in all and from the third
iteration on (the steady loop), and the reserved bytes at the peak and at the end.
Exit status 0, or 2 on a usage or tool error.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (id, what, generate arguments)
LOOPS = [
    ("gpt2-16", "GPT-2 small, PyTorch loop, micro-batch 8 x 512, 16 steps",
     ["--model", "gpt2", "--options", "framework:pytorch,micro_batch:8,seq:512,steps:16"]),
    ("custom-0.5b-14", "0.5B (24 x 1024, gated MLP), PyTorch loop, 4 x 1024, 14 steps",
     ["--model", "custom", "--options", "layers:24,hidden:1024,heads:16,kv_heads:16,ffn:4096,mlp:gated,norm:rmsnorm,"
      "biases:false,dropout:false,tied_embeddings:false,positions:0,context:4096,framework:pytorch,"
      "micro_batch:4,seq:1024,steps:14"]),
    ("gpt2-xl-12", "GPT-2 1.5B, PyTorch loop, micro-batch 4, 12 steps",
     ["--model", "gpt2-xl", "--options", "framework:pytorch,micro_batch:4,steps:12"]),
    ("gpt2-xl-24", "the same, 24 steps",
     ["--model", "gpt2-xl", "--options", "framework:pytorch,micro_batch:4,steps:24"]),
    ("gpt2-xl-accum", "GPT-2 1.5B, 4 micro-batches of 2 per step, 4 steps",
     ["--model", "gpt2-xl", "--options", "framework:pytorch,micro_batch:2,global_batch:8,steps:4"]),
    ("llama2-7b-serve", "Llama 2 7B serving 64 requests, paged KV cache, batches of 8",
     ["--model", "llama2-7b", "--options", "framework:pytorch,mode:inference,max_batch:8,steps:2"]),
    ("gpt2-forward-12", "GPT-2 small, forward passes under no_grad, 16 x 1024, 12 steps",
     ["--model", "gpt2", "--options", "framework:pytorch,mode:forward,micro_batch:16,seq:1024,steps:12"]),
]
WAYS = [("none", []), ("step() called", ["--step-at-iterations"]), ("found", ["--conf", "vmm_find_steps:true"])]


def figures(result):
    its = result.get("per_iteration", [])[2:]
    return {"util": result["utilization"], "calls": result["upstream_ops"], "syncs": result["syncs"],
            "loop_calls": sum(i["upstream_ops"] for i in its), "loop_syncs": sum(i["syncs"] for i in its),
            "peak": result["peak_reserved_bytes"] / 2**30, "final": result["final_reserved_bytes"] / 2**30}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensorpool", default=os.path.join(ROOT, "build", "tools", "tensorpool"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "steps-table"))
    ap.add_argument("--capacity", default="80GiB")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    rows = ["| loop | steps | utilization | calls / syncs | from the 3rd iteration | reserved GiB: peak / at the end |",
            "|---|---|---|---|---|---|"]
    try:
        for name, what, gen in LOOPS:
            path = os.path.join(args.work, name + ".tptrace")
            if not os.path.exists(path):
                subprocess.run([args.tensorpool, "generate", path] + gen, check=True, capture_output=True)
            for way, extra in WAYS:
                out = subprocess.run([args.tensorpool, "compare", path, "--allocators", "tensorpool-vmm", "--capacity",
                                      args.capacity, "--json"] + extra, check=True, capture_output=True, text=True)
                f = figures(json.loads(out.stdout)["allocators"][0])
                rows.append("| %s | %s | %.4f | %d / %d | %d / %d | %.3f / %.3f |" % (
                    what if way == "none" else "", way, f["util"], f["calls"], f["syncs"], f["loop_calls"],
                    f["loop_syncs"], f["peak"], f["final"]))
    except (subprocess.CalledProcessError, OSError, ValueError, KeyError) as e:
        print("steps-table: %s" % e, file=sys.stderr)
        return 2
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
