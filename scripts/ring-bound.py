#!/usr/bin/env python3
"""What a ring of its own for an optimizer's chained states would give a training loop, measured
by transforming its trace (docs/benchmarks.md, "A ring for the optimizer's chained states").

Usage: scripts/ring-bound.py TRACE [--from-step K] [--label-prefix P] [--tensorpool BIN]
                             [--capacity C] [--work DIR] [--device N] [--step-at-iterations]

A loop whose optimizer writes `x = f(x)` for each state (CS336's hand-written AdamW) replaces its
whole state set every step, first in, first out. A ring (the set's pages mapped twice, back to
back, so that the set wraps around with no call) would hold it in pages of its own. This script
does not build one; it bounds one:

  - from iteration K on (K = 1: a ring from the first step, a way in no allocator has, as it
    needs the set before the set is seen; K = 2: the ring made once the first step is known), the
    allocations whose label starts with P (default "optimizer:", the generator's states), and
    their frees, are taken out of the trace;
  - the rest is replayed against tensorpool-vmm (`tensorpool compare ... --json`);
  - from iteration K on, a ring of the set's largest live size (the set plus the block being
    replaced), rounded up to 2 MiB pages, is added to each iteration's peak reserved bytes.

Printed per iteration: the trace as it is (calls, peak reserved, peak requested), the rest
without the set, and rest + ring against the original peak requested (issue 25's fifth criterion
asks for at most 1.005 from the third iteration). The ring's own calls are not counted (its pages
are mapped once, when it is made). Needs a trace whose labels name the states (the generator's);
a trace of several devices needs --device (the one replayed and counted).
"""
import argparse
import json
import math
import os
import subprocess
import sys

PAGE = 2 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message):
    print("ring-bound: " + message, file=sys.stderr)
    sys.exit(2)


def to_jsonl(args, trace, path):
    done = subprocess.run([args.tensorpool, "convert", trace, path], capture_output=True, text=True)
    if done.returncode != 0:
        fail("converting %s failed: %s" % (trace, done.stderr.strip()))


def without_set(args, lines):
    """The trace's events with the set's allocations from iteration K on taken out; the set's
    largest live size then."""
    header, end, events = lines[0], json.loads(lines[-1]), [json.loads(line) for line in lines[1:-1]]
    if not end.get("end"):
        fail("the converted trace has no end object")
    if not events:
        fail("the trace has no events")
    devices = {e.get("device", 0) for e in events}
    if len(devices) > 1 and args.device is None:
        fail("the trace has %d devices (%s); say which with --device" % (len(devices), ", ".join(map(str, sorted(devices)))))
    if args.device is not None and args.device not in devices:
        fail("the trace has no device %d (it has %s)" % (args.device, ", ".join(map(str, sorted(devices)))))
    device = next(iter(devices)) if args.device is None else args.device
    iteration, taken, live, largest, kept = 0, {}, 0, 0, []
    for e in events:
        op = e["op"]
        if e.get("device", 0) != device:
            kept.append(e)  # not replayed (compare --device)
            continue
        if op == "iteration":
            iteration += 1
        if op == "alloc" and iteration >= args.from_step and (e.get("label") or "").startswith(args.label_prefix):
            taken[e["addr"]] = e["size"]
            live += e["size"]
            largest = max(largest, live)
            continue
        if op in ("free_requested", "free_completed") and e["addr"] in taken:
            if op == "free_completed":
                live -= taken.pop(e["addr"])
            continue
        kept.append(e)
    if iteration < 3:
        fail("the trace has %d iteration markers; at least 3 are needed" % iteration)
    if largest == 0:
        fail("no allocation labelled %r from iteration %d on" % (args.label_prefix, args.from_step))
    end["events"] = len(kept)
    return [header] + [json.dumps(e) for e in kept] + [json.dumps(end)], largest


def per_iteration(args, trace):
    command = [args.tensorpool, "compare", trace, "--allocators", "tensorpool-vmm", "--capacity", args.capacity,
               "--json", "-q"] + (["--step-at-iterations"] if args.step_at_iterations else []) + (
               ["--device", str(args.device)] if args.device is not None else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        fail("%s failed: %s" % (" ".join(command), done.stderr.strip()))
    return json.loads(done.stdout)["allocators"][0]["per_iteration"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--from-step", type=int, default=1)
    ap.add_argument("--label-prefix", default="optimizer:")
    ap.add_argument("--tensorpool", default=os.path.join(ROOT, "build", "tools", "tensorpool"))
    ap.add_argument("--capacity", default="80GiB")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "ring-bound"))
    ap.add_argument("--device", type=int, default=None)
    ap.add_argument("--step-at-iterations", action="store_true")
    args = ap.parse_args()
    if args.from_step < 1:
        fail("--from-step takes 1 or more; got %d" % args.from_step)
    os.makedirs(args.work, exist_ok=True)
    name = os.path.splitext(os.path.basename(args.trace))[0]
    whole = os.path.join(args.work, name + ".jsonl")
    to_jsonl(args, args.trace, whole)
    with open(whole) as f:
        lines = f.read().splitlines()
    rest_lines, set_bytes = without_set(args, lines)
    rest = os.path.join(args.work, "%s-without-set-from-%d.jsonl" % (name, args.from_step))
    with open(rest + ".tmp", "w") as f:
        f.write("\n".join(rest_lines) + "\n")
    os.replace(rest + ".tmp", rest)
    ring = math.ceil(set_bytes / PAGE) * PAGE
    mib = 1 << 20
    print("%s: the set at most %.1f MiB live; ring %.1f MiB from iteration %d%s" %
          (name, set_bytes / mib, ring / mib, args.from_step, ", step() per iteration" if args.step_at_iterations else ""))
    print("| iteration | as it is: calls, reserved / requested MiB | the rest: calls, reserved / requested MiB "
          "| rest + ring | ratio (as it is) |")
    print("|---|---|---|---|---|")
    for i, (a, b) in enumerate(zip(per_iteration(args, args.trace), per_iteration(args, rest)), start=1):
        total = b["peak_reserved_bytes"] + (ring if i >= args.from_step else 0)
        print("| %d | %d, %.1f / %.1f | %d, %.1f / %.1f | %.1f | %.4f (%.4f) |" % (
            i, a["upstream_ops"], a["peak_reserved_bytes"] / mib, a["peak_requested_bytes"] / mib,
            b["upstream_ops"], b["peak_reserved_bytes"] / mib, b["peak_requested_bytes"] / mib, total / mib,
            total / a["peak_requested_bytes"], a["peak_reserved_bytes"] / a["peak_requested_bytes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
