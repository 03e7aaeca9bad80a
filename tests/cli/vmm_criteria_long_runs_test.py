#!/usr/bin/env python3
"""scripts/vmm-criteria.py's sixth table (--only 6: long runs whose steps keep differing), which
generates its own jobs and needs no shared trace: one row per job, the verdict of each row the
rule applied to its printed figures, the count in the heading the rows met, one row's figures
those of `tensorpool compare` on the same trace; and bad input ends with a message and exit 2.
Usage: vmm_criteria_long_runs_test.py TENSORPOOL_BINARY SCRIPT"""
import json
import re
import subprocess
import sys
import tempfile

from checks import check, finish

binary, script = sys.argv[1], sys.argv[2]
JOBS = 5  # LONG_RUNS in the script


def run(*args):
    return subprocess.run([sys.executable, script, "--tensorpool", binary, *args], capture_output=True, text=True)


CELL = r"([\d.]+) / (\d+) / (\d+)"
ROW = re.compile(r"^\| ([\w.-]+) \| " + r" \| ".join([CELL] * 4) + r" \| (yes|\*\*no\*\*) \|$")
HEAD = re.compile(r"^### 6\. Long runs whose steps keep differing: met on (\d+) of (\d+)$", re.M)


def figures(match, cell):
    """(utilization, calls, syncs) of cell 0-3 (vmm, vmm with step(), pytorch, pytorch-expandable)."""
    g = match.groups()[1 + 3 * cell:4 + 3 * cell]
    return float(g[0]), int(g[1]), int(g[2])


def from_third_iteration(result):
    its = result["per_iteration"][2:]
    return result["utilization"], sum(i["upstream_ops"] for i in its), sum(i["syncs"] for i in its)


with tempfile.TemporaryDirectory() as work:
    done = run("--only", "6", "--traces", f"{work}/no-traces", "--work", work)
    check("exit 0 or 1 (met or not), never 2", done.returncode in (0, 1), done.stderr)
    head = HEAD.search(done.stdout)
    rows = [ROW.match(line) for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| long run")]
    check("one row per job", len(rows) == JOBS and all(rows), done.stdout)
    check("the heading counts the jobs", head is not None and int(head.group(2)) == JOBS, done.stdout)
    if head is not None and len(rows) == JOBS and all(rows):
        met = 0
        for r in rows:
            vmm, _, pytorch, expandable = (figures(r, c) for c in range(4))
            ok = r.group(14) == "yes"
            met += ok
            quiet = vmm[1] <= pytorch[1] + 2 and vmm[2] <= pytorch[2]
            best = max(pytorch[0], expandable[0])
            if vmm[0] != best:  # printed to 4 places: equal ones may be on either side
                check(f"{r.group(1)}: the verdict is the rule's", ok == (quiet and vmm[0] > best), r.group(0))
            elif not quiet:
                check(f"{r.group(1)}: not met where it is not quiet", not ok, r.group(0))
        check("the heading counts the rows met", int(head.group(1)) == met, head.group(0))
        check("exit 1 exactly when a row is not met", (done.returncode == 1) == (met < JOBS), str(done.returncode))
        # The first row's figures are those of a replay of its trace (generated into --work).
        first = rows[0]
        out = subprocess.run([binary, "compare", f"{work}/{first.group(1)}.tptrace", "--allocators",
                              "tensorpool-vmm,pytorch,pytorch-expandable", "--capacity", "80GiB", "--json", "-q"],
                             capture_output=True, text=True)
        check("compare of the first job: exit 0", out.returncode == 0, out.stderr)
        if out.returncode == 0:
            by_name = {a["allocator"]: a for a in json.loads(out.stdout)["allocators"]}
            for cell, name in ((0, "tensorpool-vmm"), (2, "pytorch"), (3, "pytorch-expandable")):
                util, calls, syncs = from_third_iteration(by_name[name])
                printed = figures(first, cell)
                check(f"{first.group(1)}, {name}: the printed figures are the replay's",
                      abs(printed[0] - util) < 5e-5 and printed[1:] == (calls, syncs), f"{printed} vs {util, calls, syncs}")

    bad = run("--only", "6,7", "--work", work)
    check("an unknown table is refused", bad.returncode == 2 and "--only takes 1, 2, 3, 4, 5, 6; got '7'" in bad.stderr,
          bad.stderr)
    bad = run("--only", "1", "--traces", f"{work}/no-traces", "--work", work)
    check("a table of the shared traces without any is refused",
          bad.returncode == 2 and "no *.pickle in" in bad.stderr, bad.stderr)

finish()
