#!/usr/bin/env python3
"""Cuts a tensorpool trace (.jsonl) to a window, as a PyTorch memory snapshot records one: the
blocks live when the window starts become seed_alloc events, and the events before it go.

Usage: scripts/trace-window.py IN.jsonl OUT.jsonl --from LABEL [--empty-cache]

  --from LABEL    the window starts at the first alloc whose label contains LABEL (a capture
                  labels each allocation "KIND:function (file:line)", e.g. "cs336_train.py:68")
  --empty-cache   an empty_cache event right after the seeds (a program that calls
                  torch.cuda.empty_cache() where its recording starts)

For instance, the captured CS336 2.7B step of docs/benchmarks.md ("Pages above the plan given
back"), whose window starts at the step's first input, with the weights live:

  python -m tensorpool.capture --out step.tptrace --steps 1 tests/python/cs336_train.py \\
      --size 2.7b --precision fp32 --context 512 --steps 1
  tensorpool convert step.tptrace step.jsonl
  scripts/trace-window.py step.jsonl window.jsonl --from cs336_train.py:68

Exit status 0 on success, 2 on bad input (what and where is printed; nothing is written).
"""
import argparse
import json
import os
import sys


def fail(message):
    print("trace-window: " + message, file=sys.stderr)
    sys.exit(2)


def read(path):
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail("%s: %s" % (path, e.strerror))
    if not lines:
        fail("%s: empty file, expected a tensorpool-trace header line" % path)
    try:
        header = json.loads(lines[0])
        events = [json.loads(line) for line in lines[1:] if line.strip()]
    except json.JSONDecodeError as e:
        fail("%s: line %d: not JSON (%s)" % (path, e.lineno, e.msg))
    if header.get("format") != "tensorpool-trace":
        fail("%s: line 1: expected a tensorpool-trace header (convert the trace with `tensorpool convert`)" % path)
    return header, [e for e in events if "op" in e]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--from", dest="start", required=True)
    ap.add_argument("--empty-cache", action="store_true")
    args = ap.parse_args()
    header, events = read(args.input)
    if any(e["op"].startswith("seed_") for e in events):
        fail("%s: already a window (it has seed events)" % args.input)
    cut = next((i for i, e in enumerate(events) if e["op"] == "alloc" and args.start in e.get("label", "")), None)
    if cut is None:
        fail("%s: no alloc has a label containing %r" % (args.input, args.start))
    live = {}
    for e in events[:cut]:
        if e["op"] == "alloc":
            live[e["addr"]] = e
        elif e["op"] == "free_completed":
            live.pop(e["addr"], None)
    out = [{"op": "seed_alloc", "device": e.get("device", 0), "stream": e.get("stream", 0), "addr": a,
            "size": e["size"], "time_us": 0} for a, e in sorted(live.items(), key=lambda kv: int(kv[0], 16))]
    if args.empty_cache:
        out.append({"op": "empty_cache", "device": 0, "stream": 0, "addr": "0x0", "size": 0,
                    "time_us": events[cut].get("time_us", 0)})
    # A block freed in the window but allocated before it is a seed: its free stays.
    out += events[cut:]
    tmp = args.output + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(header, separators=(",", ":")) + "\n")
        for e in out:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")
        f.write(json.dumps({"end": True, "events": len(out)}, separators=(",", ":")) + "\n")
    os.replace(tmp, args.output)
    print("wrote %s: %d seed blocks (%.3f GiB), %d events" %
          (args.output, len(live), sum(e["size"] for e in live.values()) / 2**30, len(out)))


if __name__ == "__main__":
    main()
