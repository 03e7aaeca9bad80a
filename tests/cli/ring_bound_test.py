#!/usr/bin/env python3
"""scripts/ring-bound.py on a small generated loop with a hand-written AdamW: the states are taken
out from the step asked for, the ring of their largest live size is added from there, and bad
input ends with a message and exit 2. Usage: ring_bound_test.py TENSORPOOL_BINARY SCRIPT"""
import json
import re
import subprocess
import sys
import tempfile

from checks import check, finish

binary, script = sys.argv[1], sys.argv[2]
MIB = 1 << 20


def run(*args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


ROW = re.compile(r"^\| (\d+) \| (\d+), ([\d.]+) / ([\d.]+) \| (\d+), ([\d.]+) / ([\d.]+) \| ([\d.]+) \| ([\d.]+) \(([\d.]+)\) \|$")

with tempfile.TemporaryDirectory() as work:
    trace = f"{work}/loop.tptrace"
    options = ("layers:2,hidden:128,heads:4,kv_heads:4,ffn:512,vocab:1000,context:64,seq:64,micro_batch:2,"
               "framework:pytorch,optimizer_impl:handwritten,precision:fp32,steps:4")
    subprocess.run([binary, "generate", trace, "--model", "custom", "--options", options], check=True,
                   capture_output=True)
    for from_step in (1, 2):
        done = run(trace, "--tensorpool", binary, "--work", work, "--from-step", str(from_step))
        check(f"from step {from_step}: exit 0", done.returncode == 0, done.stderr)
        head = re.search(r"the set at most ([\d.]+) MiB live; ring ([\d.]+) MiB from iteration (\d+)", done.stdout)
        check(f"from step {from_step}: the set and the ring are named", head is not None, done.stdout)
        rows = [ROW.match(line) for line in done.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
        check(f"from step {from_step}: one row per iteration", len(rows) == 4 and all(rows), done.stdout)
        if head is None or len(rows) != 4 or not all(rows):
            continue
        set_mib, ring_mib = float(head.group(1)), float(head.group(2))
        check(f"from step {from_step}: the ring is the set in 2 MiB pages",
              set_mib <= ring_mib < set_mib + 2 and ring_mib % 2 == 0, head.group(0))
        for r in rows:
            i = int(r.group(1))
            requested, rest_requested = float(r.group(4)), float(r.group(7))
            rest_reserved, total = float(r.group(6)), float(r.group(8))
            ring = ring_mib if i >= from_step else 0
            check(f"from step {from_step}, iteration {i}: rest + ring", abs(total - (rest_reserved + ring)) < 0.11,
                  r.group(0))
            # Figures printed to 0.1 MiB: the ratio within 1%.
            check(f"from step {from_step}, iteration {i}: ratio against the trace's peak",
                  abs(float(r.group(9)) - total / requested) < 0.01 * total / requested, r.group(0))
            # The states live at every peak after the first step's; at the ring's first step the
            # set it replaces is still in the rest. Taken out, the rest requests less after that.
            if i > max(from_step, 1):
                check(f"from step {from_step}, iteration {i}: the rest requests less", rest_requested < requested,
                      r.group(0))
            if i < from_step:
                check(f"from step {from_step}, iteration {i}: untouched before the ring",
                      r.group(2, 3, 4) == r.group(5, 6, 7), r.group(0))
    # The same loop on two devices: --device names the one replayed, and the ring is its own set's.
    subprocess.run([binary, "convert", trace, f"{work}/one.jsonl"], check=True, capture_output=True)
    with open(f"{work}/one.jsonl") as f:
        lines = f.read().splitlines()
    events = [json.loads(line) for line in lines[1:-1]]
    twin = [dict(e, device=1, addr=hex(int(e["addr"], 16) + (1 << 44))) for e in events]
    end = json.loads(lines[-1])
    end["events"] = 2 * len(events)
    with open(f"{work}/two.jsonl", "w") as f:
        f.write("\n".join([lines[0]] + [json.dumps(e) for e in events + twin] + [json.dumps(end)]) + "\n")
    bad = run(f"{work}/two.jsonl", "--tensorpool", binary, "--work", work)
    check("two devices without --device are refused", bad.returncode == 2 and "say which with --device" in bad.stderr,
          bad.stderr)
    bad = run(f"{work}/two.jsonl", "--tensorpool", binary, "--work", work, "--device", "2")
    check("a device the trace lacks is refused", bad.returncode == 2 and "no device 2" in bad.stderr, bad.stderr)
    one = run(trace, "--tensorpool", binary, "--work", work)
    two = run(f"{work}/two.jsonl", "--tensorpool", binary, "--work", work, "--device", "1")
    check("--device 1 of the twin is the single device's run", two.returncode == 0 and
          one.stdout.splitlines()[1:] == two.stdout.splitlines()[1:], one.stdout + two.stdout + two.stderr)
    bad = run(trace, "--tensorpool", binary, "--work", work, "--from-step", "0")
    check("--from-step 0 is refused", bad.returncode == 2 and "--from-step takes 1 or more" in bad.stderr, bad.stderr)
    bad = run(trace, "--tensorpool", binary, "--work", work, "--label-prefix", "nothing:")
    check("a label no allocation has is refused", bad.returncode == 2 and "no allocation labelled" in bad.stderr,
          bad.stderr)
    bad = run(f"{work}/absent.tptrace", "--tensorpool", binary, "--work", work)
    check("a missing trace is refused", bad.returncode == 2 and "converting" in bad.stderr, bad.stderr)

finish()
