#!/usr/bin/env python3
"""Every deterministic figure the CLI gives on the shared traces and the generated suite, in one
JSON file: what a change that must not move behaviour (a refactoring) is checked against.

Usage: scripts/replay-digest.py OUT.json [--tensorpool BIN] [--traces DIR] [--work DIR] [--quick]
                                [--extra TRACE ...]
       scripts/replay-digest.py --diff BEFORE.json AFTER.json

For each shared trace (../shared/traces/*.pickle) and each trace of the generated suite
(scripts/fit-tables.py's SUITE, made with `tensorpool generate`):
  compare TRACE --json                every allocator, one pass (80 GiB; the suite at its capacity)
  compare TRACE --json --warmup 1     the steady state
  fit TRACE --json --allocators tensorpool,tensorpool-vmm --precision-pct 0.05   (not with --quick)
and the output of `demo --json` and of `plan --model gpt2-xl --capacity 24GiB --global-batch 64 --json`.
Host times (host_ns_per_op, *_seconds) are dropped: the replays are deterministic, the clock is not.
--diff prints every path whose value differs and exits 1 when one does.
"""
import argparse
import ast
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISY = ("host_ns", "seconds", "elapsed", "wall")


def strip(value):
    if isinstance(value, dict):
        return {k: strip(v) for k, v in value.items() if not any(n in k for n in NOISY)}
    if isinstance(value, list):
        return [strip(v) for v in value]
    return value


def run_json(args):
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    return strip(json.loads(out.stdout))


def suite():
    """scripts/fit-tables.py's SUITE (that script runs when imported: its literal is read instead)."""
    tree = ast.parse(open(os.path.join(ROOT, "scripts", "fit-tables.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SUITE" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("replay-digest: no SUITE in scripts/fit-tables.py")


def digest(args):
    out = {}
    traces = sorted(glob.glob(os.path.join(args.traces, "*.pickle")))
    items = [(os.path.basename(t)[:-len(".pickle")], t, "80GiB") for t in traces]
    os.makedirs(args.work, exist_ok=True)
    for sid, _, gen, capacity in suite():
        trace = os.path.join(args.work, sid + ".tptrace")
        subprocess.run([args.tensorpool, "generate", trace] + gen, check=True, capture_output=True)
        items.append((sid, trace, capacity))
    items += [(os.path.basename(t), t, "80GiB") for t in args.extra]
    for name, trace, capacity in items:
        print(name, flush=True, file=sys.stderr)
        base = [args.tensorpool, "compare", trace, "--json", "--capacity", capacity]
        out[name + "/compare"] = run_json(base)
        out[name + "/compare-warmup1"] = run_json(base + ["--warmup", "1"])
        if not args.quick:
            out[name + "/fit"] = run_json([args.tensorpool, "fit", trace, "--json", "-q", "--allocators",
                                           "tensorpool,tensorpool-vmm", "--precision-pct", "0.05"])
    out["demo"] = run_json([args.tensorpool, "demo", "--json"])
    out["plan-gpt2-xl"] = run_json([args.tensorpool, "plan", "--model", "gpt2-xl", "--capacity", "24GiB",
                                    "--global-batch", "64", "--json", "-q"])
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


def diff(a, b, path, found):
    if type(a) is not type(b):
        found.append("%s: %r -> %r" % (path, a, b))
    elif isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                found.append("%s/%s: only %s" % (path, k, "after" if k in b else "before"))
            else:
                diff(a[k], b[k], path + "/" + k, found)
    elif isinstance(a, list):
        if len(a) != len(b):
            found.append("%s: %d items -> %d" % (path, len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, "%s[%d]" % (path, i), found)
    elif a != b:
        found.append("%s: %r -> %r" % (path, a, b))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?")
    p.add_argument("--tensorpool", default=os.path.join(ROOT, "build", "tools", "tensorpool"))
    p.add_argument("--traces", default=os.path.join(ROOT, "..", "shared", "traces"))
    p.add_argument("--work", default=os.path.join(ROOT, "build", "digest"))
    p.add_argument("--quick", action="store_true", help="no fit searches")
    p.add_argument("--extra", nargs="*", default=[], metavar="TRACE", help="more traces, replayed at 80 GiB")
    p.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"))
    args = p.parse_args()
    if args.diff:
        found = []
        diff(json.load(open(args.diff[0])), json.load(open(args.diff[1])), "", found)
        print("\n".join(found[:200]) if found else "identical")
        if len(found) > 200:
            print("... %d differences in all" % len(found))
        return 1 if found else 0
    if not args.out:
        p.error("OUT.json is needed (or --diff)")
    digest(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
