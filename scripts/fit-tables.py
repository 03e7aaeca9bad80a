#!/usr/bin/env python3
"""Does it fit? Records `tensorpool fit` on every shared trace, and a synthetic suite of real model
shapes replayed against every allocator, then renders the tables of docs/benchmarks.md.

Usage: scripts/fit-tables.py [TENSORPOOL_BINARY] [TRACES_DIR] [WORK_DIR]
(defaults: build/tools/tensorpool, ../shared/traces, build/fit-suite for the generated traces).

Each JSON result goes through `scripts/bench-tables.py record NAME -- COMMAND` into docs/results/
(with the commit, date, machine and command that made it):
  fit-shared-TRACE         tensorpool fit TRACE --json                  (every shared trace)
  fit-suite-ID-compare     tensorpool compare T --capacity C --json     (each suite trace)
  fit-suite-ID-fit         tensorpool fit T --json
and docs/results/fit-suite.json lists the suite (ID, what it is, the generate arguments, C).
Then `scripts/bench-tables.py render` rewrites the tables fit-shared and fit-suite.
"""
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
TABLES = os.path.join(ROOT, "scripts", "bench-tables.py")

binary = sys.argv[1] if len(sys.argv) > 1 else "build/tools/tensorpool"
traces = sys.argv[2] if len(sys.argv) > 2 else "../shared/traces"
work = sys.argv[3] if len(sys.argv) > 3 else "build/fit-suite"

# (id, what it is, generate arguments, capacity the suite is compared at). The training runs are of
# the Megatron-style loop (framework:megatron): tp, dp and ZeRO are modelled there.
SUITE = [
    ("llama2-7b-zero3", "Llama-2-7B training, full recompute, ZeRO-3 over 8 ranks (micro-batch 4, seq 4096)",
     ["--model", "llama2-7b", "--checkpointing", "full", "--zero", "3", "--dp", "8", "--micro-batch", "4",
      "--global-batch", "64", "--options", "framework:megatron"], "80GiB"),
    ("gpt2-xl-pressure", "GPT-2 1.5B training at high memory pressure (micro-batch 6, sequence lengths uniform "
     "in [512, 1024], on a 40 GiB device)",
     ["--model", "gpt2-xl", "--micro-batch", "6", "--global-batch", "60", "--options",
      "framework:megatron,seq_dist:uniform"], "40GiB"),
    ("mixtral-8x7b", "Mixtral-8x7B training (top-2 of 8 experts, the busiest 1.5x the mean; ZeRO-3 over 32 ranks, "
     "full recompute, micro-batch 2, seq 4096)",
     ["--model", "mixtral-8x7b", "--zero", "3", "--dp", "32", "--checkpointing", "full", "--micro-batch", "2",
      "--global-batch", "128", "--options", "framework:megatron,moe_imbalance:1.5"], "80GiB"),
    ("llama2-13b-inference", "Llama-2-13B inference, continuous batching (256 requests, 1 per decode step on "
     "average, up to 64 at once, paged KV cache)",
     ["--model", "llama2-13b", "--mode", "inference", "--options", "requests:256,max_batch:64,arrival_rate:1"],
     "80GiB"),
]


def record(name, command):
    subprocess.run([sys.executable, TABLES, "record", name, "--"] + command, check=True)


def write_manifest():
    rows = [{"id": i, "name": n, "generate": g, "capacity": c} for i, n, g, c in SUITE]
    path = os.path.join(RESULTS, "fit-suite.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"tensorpool": binary, "work": work, "suite": rows}, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)


def main():
    os.makedirs(work, exist_ok=True)
    os.makedirs(RESULTS, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(traces, "*.pickle"))):
        name = os.path.basename(path)[:-len(".pickle")]
        print("fit", name, flush=True)
        record("fit-shared-" + name, [binary, "fit", path, "--json"])
    for sid, _, args, capacity in SUITE:
        trace = os.path.join(work, sid + ".tptrace")
        print("suite", sid, flush=True)
        subprocess.run([binary, "generate", trace] + args, check=True, capture_output=True)
        record("fit-suite-%s-compare" % sid, [binary, "compare", trace, "--capacity", capacity, "--json"])
        record("fit-suite-%s-fit" % sid, [binary, "fit", trace, "--json"])
    write_manifest()
    subprocess.run([sys.executable, TABLES, "render"], check=True)


if __name__ == "__main__":
    main()
