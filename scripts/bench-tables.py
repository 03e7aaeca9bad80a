#!/usr/bin/env python3
"""Turns benchmark and replay JSON into the tables of docs/benchmarks.md.

  scripts/bench-tables.py record NAME -- COMMAND...
      runs COMMAND (its stdout must be JSON: Google Benchmark with --benchmark_format=json, the
      CLI with --json, or a JSON-printing tool) and keeps the output in docs/results/NAME.json,
      with docs/results/NAME.meta.json saying which commit, date, machine and command made it.
  scripts/bench-tables.py render
      rewrites every table of docs/benchmarks.md between <!-- table:ID --> and
      <!-- /table:ID --> from docs/results/, each stamped with its inputs' commit, date, machine
      and command. Tables whose inputs are missing say so.
"""
import datetime
import glob
import json
import os
import platform
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
MIB = 1 << 20
GIB = 1 << 30


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    try:
        load = "%.1f" % os.getloadavg()[0]
    except OSError:
        load = "?"
    return "%s, %d cores, load average %s" % (platform.machine(), os.cpu_count() or 0, load)


def record(name, command):
    started = datetime.datetime.now(datetime.timezone.utc)
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("bench-tables: %s exited %d:\n%s" % (" ".join(command), out.returncode, out.stderr[-2000:]))
    json.loads(out.stdout)  # must be JSON
    os.makedirs(RESULTS, exist_ok=True)
    # Uncommitted results (docs/results/, what record writes) do not make the code differ from HEAD.
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results")
    dirty = " (with uncommitted changes)" if changed else ""
    meta = {"commit": git("rev-parse", "--short", "HEAD") + dirty, "machine": machine(),
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "command": " ".join(command)}
    for path, text in ((name + ".json", out.stdout), (name + ".meta.json", json.dumps(meta, indent=2) + "\n")):
        tmp = os.path.join(RESULTS, path + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(RESULTS, path))


def load(name):
    path = os.path.join(RESULTS, name + ".json")
    if not os.path.exists(path):
        return None, None
    with open(path) as f:
        data = json.load(f)
    meta_path = os.path.join(RESULTS, name + ".meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    return data, meta


def stamp(*metas):
    lines = []
    for m in metas:
        if m:
            lines.append("Commit `%s`, %s, %s: `%s`" % (m.get("commit", "?"), m.get("date", "?"),
                                                      m.get("machine", "?"), m.get("command", "?")))
    return "\n\n".join(lines) + "\n\n"


def trace_name(path):
    return re.sub(r"\.(pickle|tptrace|jsonl)$", "", os.path.basename(path))


# --- CUB side by side ----------------------------------------------------------------------------

def gbench_medians(data):
    rows = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        m = re.match(r"pair/([a-z-]+)(?:/([a-z_]+))?/size:(\d+)/live:(\d+)/real_time/threads:(\d+)", b["run_name"])
        if not m:
            continue
        allocator, lanes = m.group(1), m.group(2) or "same_stream"
        if allocator == "tensorpool-fixed":  # the name of mode:fixed before the vmm side was added
            allocator = "tensorpool"
        key = (allocator, int(m.group(3)), int(m.group(4)), int(m.group(5)))
        rows[key if lanes == "same_stream" else key + (lanes,)] = b
    return rows


def size_text(n):
    return "%d MiB" % (n // MIB) if n >= MIB else "%d KiB" % (n // 1024)


def table_cub(_):
    one, m1 = load("bench-cub")
    two, m2 = load("bench-cub-2threads")
    if not one:
        return "(no results: run `scripts/bench-tables.py record bench-cub -- ...`)\n"
    r = gbench_medians(one)
    out = [stamp(m1), "One thread, CPU time per allocate + free pair (median of 5 repetitions):\n",
           "| size | live blocks | tensorpool | CUB (all sizes cached) | tensorpool / CUB | CUB default (stand-in cudaMalloc for 64/100 MiB) |",
           "|---|---|---|---|---|---|"]
    sizes = sorted({k[1] for k in r})
    for size in sizes:
        for live in (1000, 100000):
            tp, cub, dflt = (r.get((a, size, live, 1)) for a in ("tensorpool", "cub", "cub-default"))
            if not tp or not cub:
                continue
            out.append("| %s | %dk | %.1f ns | %.1f ns | %.2f | %s |" % (
                size_text(size), live // 1000, tp["cpu_time"], cub["cpu_time"], tp["cpu_time"] / cub["cpu_time"],
                "%.1f ns" % dflt["cpu_time"] if dflt else "-"))
    out.append("\nGrowth from 1k to 100k live blocks (CPU time ratio 100k / 1k):\n")
    out.append("| size | tensorpool | CUB |")
    out.append("|---|---|---|")
    for size in sizes:
        vals = []
        for a in ("tensorpool", "cub"):
            lo, hi = r.get((a, size, 1000, 1)), r.get((a, size, 100000, 1))
            vals.append("%.2f" % (hi["cpu_time"] / lo["cpu_time"]) if lo and hi else "-")
        out.append("| %s | %s | %s |" % (size_text(size), vals[0], vals[1]))
    if two:
        r2 = gbench_medians(two)
        out.append("\n" + stamp(m2) + "Two threads on one allocator, per pair and thread (median of 5): "
                   "wall time (what a thread waits, lock contention included) and CPU time:\n")
        out.append("| size | live blocks | tensorpool wall | CUB wall | tensorpool / CUB wall | tensorpool CPU | CUB CPU |")
        out.append("|---|---|---|---|---|---|---|")
        for size in sizes:
            for live in (1000, 100000):
                tp, cub = r2.get(("tensorpool", size, live, 2)), r2.get(("cub", size, live, 2))
                if tp and cub:
                    out.append("| %s | %dk | %.0f ns | %.0f ns | %.2f | %.1f ns | %.1f ns |" % (
                        size_text(size), live // 1000, tp["real_time"], cub["real_time"],
                        tp["real_time"] / cub["real_time"], tp["cpu_time"], cub["cpu_time"]))
    return "\n".join(out) + "\n"


# --- cub model against the real CUB ----------------------------------------------------------------

def table_cub_validation(_):
    after, m = load("cub-vs-model")
    before, mb = load("cub-vs-model-before-fix")
    if not after:
        return "(no results)\n"
    prior = {t["trace"]: t for t in before["traces"]} if before else {}
    out = [stamp(m, mb), "| trace | peak reserved MiB, real / model | cudaMalloc real / model | cudaFree real / model | syncs real / model | syncs of the model before the fix | OOMs real / model |",
           "|---|---|---|---|---|---|---|"]
    for t in after["traces"]:
        real, model = t["real"], t["model"]
        old = prior.get(t["trace"], {}).get("model", {})
        out.append("| %s | %.0f / %.0f | %d / %d | %d / %d | %d / %d | %s | %d / %d |" % (
            trace_name(t["trace"]), real["peak_reserved_bytes"] / MIB, model["peak_reserved_bytes"] / MIB,
            real["mallocs"] + real["seeding_mallocs"], model["mallocs"] + model["seeding_mallocs"],
            real["frees"], model["frees"], real["syncs"], model["syncs"], old.get("syncs", "-"),
            real["ooms"], model["ooms"]))
    return "\n".join(out) + "\n"


# --- RMM models on every shared trace -------------------------------------------------------------

def compare_rows(data):
    rows = {}
    if data.get("recorded"):
        rows["PyTorch (actual)"] = data["recorded"]
    for a in data["allocators"]:
        rows[a["allocator"]] = a
    return rows


def table_rmm(_):
    names = sorted(p[len(RESULTS) + 1:-5] for p in glob.glob(os.path.join(RESULTS, "rmm-*.json"))
                   if not p.endswith(".meta.json"))
    if not names:
        return "(no results)\n"
    out, metas = [], []
    header = ("| trace | allocator (settings) | peak requested GiB | peak reserved GiB | utilization | "
              "upstream ops | start-state ops | syncs | OOMs |")
    out.append(header)
    out.append("|---|---|---|---|---|---|---|---|---|")
    for name in names:
        data, meta = load(name)
        metas.append(meta)
        defaults = name.endswith("-defaults")
        settings = {"rmm-pool": "initial_pool_size:0", "rmm-arena": "arena_size:80GiB"}
        for label, r in compare_rows(data).items():
            if label == "pytorch" or (label == "PyTorch (actual)" and not defaults):
                continue
            shown = label if label.startswith("PyTorch") else "%s (%s)" % (label, "defaults" if defaults else settings.get(label, ""))
            out.append("| %s | %s | %.3f | %.3f | %.4f | %d | %d | %d | %d |" % (
                trace_name(data["trace"]), shown.replace(" ()", ""), r["peak_requested_bytes"] / GIB,
                r["peak_reserved_bytes"] / GIB, r["utilization"], r["upstream_ops"], r["seeding_upstream_ops"],
                r["syncs"], r["ooms"]))
    commands = sorted({m.get("command", "") for m in metas if m})
    first = metas[0] or {}
    head = "Commit `%s`, %s, %s; commands (one per trace):\n\n" % (first.get("commit"), first.get("date"), first.get("machine"))
    head += "\n".join("    " + c for c in commands) + "\n\n"
    return head + "\n".join(out) + "\n"


# --- empty_cache -----------------------------------------------------------------------------------

def table_empty_cache(_):
    fixture, m = load("empty-cache-fixture")
    unmarked, mu = load("empty-cache-fixture-unmarked")
    if not fixture:
        return "(no results)\n"
    out = [stamp(m, mu), "| trace | allocator | segment allocs | segment frees | peak reserved MiB |", "|---|---|---|---|---|"]
    rows = compare_rows(fixture)
    for label, r in rows.items():
        out.append("| snap_empty_cache (fixture) | %s | %d | %d | %.0f |" % (
            label, r["upstream_allocs"], r["upstream_frees"], r["peak_reserved_bytes"] / MIB))
    if unmarked:
        for label, r in compare_rows(unmarked).items():
            if label != "PyTorch (actual)":
                out.append("| same, empty_cache events removed | %s | %d | %d | %.0f |" % (
                    label, r["upstream_allocs"], r["upstream_frees"], r["peak_reserved_bytes"] / MIB))
    shared, ms = load("empty-cache-shared")
    if shared:
        out.append("\n" + stamp(ms) + "| shared trace | empty_cache calls found | segment_free events |")
        out.append("|---|---|---|")
        for t in shared:
            out.append("| %s | %d | %d |" % (trace_name(t["trace"]), t["ops"].get("empty_cache", 0),
                                           t["ops"].get("segment_free", 0)))
    return "\n".join(out) + "\n"


# --- does it fit? (scripts/fit-tables.py records these) ------------------------------------------

def fit_cell(d):
    if not d["fits"]:
        return "none"
    cell = "%.3f (%.4f)" % (d["capacity_bytes"] / GIB, d["ratio_to_peak_requested"])
    if not d["verified"]:
        cell += " not checked"
    if not d["monotone"]:
        cell += " (OOM at %.3f above)" % (d["oom_above_bytes"] / GIB)
    return cell


def first_stamp(metas, template):
    metas = [m for m in metas if m]
    if not metas:
        return ""
    commits = sorted({m.get("commit", "?") for m in metas})
    dates = sorted(m.get("date", "?") for m in metas)
    return "Commit `%s`, %s to %s, %s; per trace: `%s`\n\n" % (
        ", ".join(commits), dates[0], dates[-1], metas[0].get("machine", "?"), template)


def table_fit_shared(_):
    names = sorted(p[len(RESULTS) + 1:-5] for p in glob.glob(os.path.join(RESULTS, "fit-shared-*.json"))
                   if not p.endswith(".meta.json"))
    if not names:
        return "(no results: run `scripts/fit-tables.py`)\n"
    loaded = [load(n) for n in names]
    allocators = [a["allocator"] for a in loaded[0][0]["allocators"]]
    out = [first_stamp([m for _, m in loaded], "tensorpool fit TRACE --json"),
           "Fit GiB (its ratio to the peak requested), per device:\n",
           "| trace | device | peak requested GiB | " + " | ".join(allocators) + " |",
           "|---|---|---|" + "---|" * len(allocators)]
    for data, _ in loaded:
        by = {a["allocator"]: a for a in data["allocators"]}
        for i, dev in enumerate(by[allocators[0]]["devices"]):
            out.append("| %s | %d | %.3f | %s |" % (
                trace_name(data["trace"]), dev["device"], dev["peak_requested_bytes"] / GIB,
                " | ".join(fit_cell(by[a]["devices"][i]) for a in allocators)))
    return "\n".join(out) + "\n"


def table_fit_vmm(_):
    names = sorted(p[len(RESULTS) + 1 + len("fit-vmm-"):-5] for p in glob.glob(os.path.join(RESULTS, "fit-vmm-*.json"))
                   if not p.endswith(".meta.json"))
    if not names:
        return "(no results: run the commands below)\n"
    others = ("pytorch", "pytorch-expandable", "cub", "raw")
    metas = []
    out = []
    rows = ["| trace | device | peak requested GiB | best other GiB | tensorpool-vmm GiB (/ best) | "
            "`vmm_chunk_divisor:0` GiB (/ best) |", "|---|---|---|---|---|---|"]
    for name in names:
        data, meta = load("fit-vmm-" + name)
        fine, fine_meta = load("fit-vmm0-" + name)  # the mode without vmm_chunk_divisor
        metas += [meta, fine_meta]
        by = {a["allocator"]: a for a in data["allocators"]}
        vmm = by["tensorpool-vmm"]["devices"]
        fine_devices = fine["allocators"][0]["devices"] if fine else [None] * len(vmm)
        for i, dev in enumerate(vmm):
            best = min(others, key=lambda a: by[a]["devices"][i]["capacity_bytes"])
            best_bytes = by[best]["devices"][i]["capacity_bytes"]

            def cell(d):
                if d is None or not d["fits"]:
                    return "-"
                ratio = d["capacity_bytes"] / best_bytes
                return "%.3f (%.4f)%s" % (d["capacity_bytes"] / GIB, ratio, "" if ratio <= 1.005 else " above 1.005")

            rows.append("| %s | %d | %.3f | %s %.3f | %s | %s |" % (
                trace_name(data["trace"]), dev["device"], dev["peak_requested_bytes"] / GIB, best, best_bytes / GIB,
                cell(dev), cell(fine_devices[i])))
    out.append(first_stamp(metas, "tensorpool fit TRACE --allocators tensorpool-vmm,pytorch,pytorch-expandable,cub,raw "
                                  "--precision-pct 0.05 --json` and `tensorpool fit TRACE --allocators tensorpool-vmm "
                                  "--allocator-conf tensorpool-vmm=vmm_chunk_divisor:0 --precision-pct 0.05 --json"))
    return "\n".join(out + rows) + "\n"


def table_fit_suite(_):
    manifest, _ = load("fit-suite")
    if not manifest:
        return "(no results: run `scripts/fit-tables.py`)\n"
    out = []
    for item in manifest["suite"]:
        compared, mc = load("fit-suite-%s-compare" % item["id"])
        fitted, mf = load("fit-suite-%s-fit" % item["id"])
        if not compared or not fitted:
            out.append("**%s**: (no results)\n" % item["name"])
            continue
        fits = {a["allocator"]: a for a in fitted["allocators"]}
        out.append("**%s**: `tensorpool generate T.tptrace %s`, then `tensorpool compare T.tptrace --capacity %s "
                   "--json` and `tensorpool fit T.tptrace --json` (commit `%s`, %s)\n" % (
                       item["name"], " ".join(item["generate"]), item["capacity"], mc.get("commit", "?"),
                       mc.get("date", "?")))
        out.append("| allocator | peak requested GiB | peak reserved GiB at %s | utilization | OOMs at %s | "
                   "upstream ops | fits GiB (x peak requested) |" % (item["capacity"], item["capacity"]))
        out.append("|---|---|---|---|---|---|---|")
        for r in compared["allocators"]:
            f = fits[r["allocator"]]
            cell = fit_cell(f["devices"][0]) if len(f["devices"]) == 1 else "%.3f" % (f["capacity_bytes"] / GIB)
            out.append("| %s | %.3f | %.3f | %.4f | %d | %d | %s |" % (
                r["allocator"], r["peak_requested_bytes"] / GIB, r["peak_reserved_bytes"] / GIB,
                r["utilization"], r["ooms"], r["upstream_ops"], cell))
        out.append("")
    return "\n".join(out)


# --- the GPU run --------------------------------------------------------------------------------

def table_gpu(_):
    gpu = os.path.join(RESULTS, "gpu")
    runs = sorted(glob.glob(os.path.join(gpu, "replay-*.jsonl")))
    if not runs:
        return ("**Not yet run on a GPU.** `scripts/gpu-check.sh` with `scripts/gpu/run.sh` is ready and was "
                "dry-run here (no GPU: it builds the programs and says so). Its results (OUT/gpu/) go to "
                "docs/results/gpu/, and this script then fills these tables: per-call costs, replays on the "
                "GPU next to the simulated figures, pinned staging, sleep and wake.\n")
    out = []
    costs = os.path.join(gpu, "call-costs.json")
    if os.path.exists(costs):
        calls = json.load(open(costs))["calls"]
        sizes = sorted({p["bytes"] for v in calls.values() for p in v})
        out += ["Per-call host cost on the GPU (median us):\n", "| call | " + " | ".join(size_text(b) for b in sizes) + " |",
                "|---|" + "---|" * len(sizes)]
        for call, points in sorted(calls.items()):
            by = {p["bytes"]: p["median_ns"] for p in points}
            out.append("| %s | %s |" % (call, " | ".join("%.1f" % (by[b] / 1000) if b in by else "-" for b in sizes)))
        out.append("")
    simulated_name = {"raw": "raw", "tensorpool-async": "tensorpool", "tensorpool-vmm-mode": "tensorpool-vmm",
                      "cub": "cub", "rmm-pool": "rmm-pool"}
    out += ["Replays on the GPU (device 0 of each trace), with the simulator's figures for the same allocator:\n",
            "| trace | allocator | wall ms | host ns per op | peak reserved GiB | OOMs | simulated peak reserved GiB | simulated upstream ms |",
            "|---|---|---|---|---|---|---|---|"]
    for path in runs:
        name = os.path.basename(path)[len("replay-"):-len(".jsonl")]
        sim_path = os.path.join(gpu, "simulated-%s.json" % name)
        sim = {a["allocator"]: a for a in json.load(open(sim_path))["allocators"]} if os.path.exists(sim_path) else {}
        for line in open(path):
            r = json.loads(line)
            s_row = sim.get(simulated_name.get(r["allocator"], ""), {})
            out.append("| %s | %s | %.1f | %.0f | %.3f | %d | %s | %s |" % (
                name, r["allocator"], r["wall_ms"], r["host_ns_per_op"], r["peak_reserved_bytes"] / GIB, r["ooms"],
                "%.3f" % (s_row["peak_reserved_bytes"] / GIB) if s_row else "-",
                "%.2f" % (s_row["modelled_upstream_ns"] / 1e6) if s_row else "-"))
    pinned = os.path.join(gpu, "pinned.json")
    if os.path.exists(pinned):
        out += ["", "Pinned staging (medians):\n", "| size | buffer | allocate + free ns | H2D GB/s |", "|---|---|---|---|"]
        for r in json.load(open(pinned))["rows"]:
            out.append("| %d MiB | %s | %.0f | %.2f |" % (r["mib"], r["how"], r["alloc_free_ns"], r["h2d_gb_per_s"]))
    sleep = os.path.join(gpu, "sleep.json")
    if os.path.exists(sleep):
        out += ["", "Sleep and wake on the vmm backend (`cuda/gpu/sleep_wake.cpp`, medians of the rounds):\n",
                "| held | contents | sleep ms | wake ms | sleep ms per GiB | wake ms per GiB | free memory back (least) | checks |",
                "|---|---|---|---|---|---|---|---|"]
        for r in json.load(open(sleep))["rows"]:
            out.append("| %d MiB | %s | %.2f | %.2f | %.2f | %.2f | %.3f GiB | %s |" % (
                r["mib"], r["contents"], r["sleep_ms"], r["wake_ms"], r["sleep_ms_per_gib"], r["wake_ms_per_gib"],
                r["least_freed_bytes"] / GIB, "passed" if r["checks_ok"] else "**failed**"))
    return "\n".join(out) + "\n"


# --- no stalls: per-call latency, threads, the pair in both modes (issue 24) -------------------

def table_latency(_):
    data, meta = load("latency")
    before, meta_before = load("latency-before")
    if not data:
        return "(no results: run `scripts/bench-tables.py record latency -- build-release/bench/tensorpool_bench_latency --json -`)\n"
    old = {(r["trace"], r["mode"], r["call"]): r for r in (before or {}).get("rows", [])}
    out = [stamp(meta, meta_before),
           "Host time per call that made no upstream call, microseconds: p50 / p99 / p99.9 (medians over %d runs "
           "of %d passes), and the max as the lowest and highest over the runs; `before` is 2850efd (planner in the "
           "free, stream synchronization in the remap, whole-table rehash), measured in the same session.\n"
           % (data.get("runs", 0), data.get("passes", 0)),
           "| trace | call | default mode p50 / p99 / p99.9 | default max (lowest, highest) | before: max (lowest, highest) "
           "| fixed mode max (lowest, highest) | calls with upstream calls (default) |",
           "|---|---|---|---|---|---|---|"]
    rows = {(r["trace"], r["mode"], r["call"]): r for r in data["rows"]}
    for (trace, mode, call), r in rows.items():
        if mode != "default":
            continue
        f = rows.get((trace, "fixed", call))
        b = old.get((trace, mode, call))
        out.append("| %s | %s | %.2f / %.2f / %.2f | %.1f, %.1f | %s | %s | %d |" % (
            trace, call, r["p50_us"], r["p99_us"], r["p999_us"], r["max_us_lowest"], r["max_us_highest"],
            "%.1f, %.1f" % (b["max_us_lowest"], b["max_us_highest"]) if b else "-",
            "%.1f, %.1f" % (f["max_us_lowest"], f["max_us_highest"]) if f else "-", r["with_upstream"]))
    return "\n".join(out) + "\n"


TENSORPOOL_NAMES = {"tensorpool": "tensorpool, mode:fixed", "tensorpool-vmm": "tensorpool, default (vmm)"}


def table_threads(_):
    data, meta = load("bench-cub-threads")
    if not data:
        return "(no results: run `scripts/bench-tables.py record bench-cub-threads -- ...`)\n"
    r = gbench_medians(data)
    out = [stamp(meta), "Wall time per allocate + free pair, all threads together (median of the repetitions; "
           "total throughput is its inverse), and the total throughput of 2 threads over 1 on the same kind of "
           "stream (the default stream, which holds the fill; or streams of their own):\n",
           "| size | live | allocator | 1 thread | 2 threads, same stream | x 1 thread | 1 thread, own stream | "
           "2 threads, own streams | x 1 thread |",
           "|---|---|---|---|---|---|---|---|---|"]
    sizes = sorted({k[1] for k in r})
    for size in sizes:
        for live in (1000, 100000):
            for a in ("tensorpool", "tensorpool-vmm", "cub"):
                one, same = r.get((a, size, live, 1)), r.get((a, size, live, 2))
                one_own, own = r.get((a, size, live, 1, "own_streams")), r.get((a, size, live, 2, "own_streams"))
                if not one:
                    continue
                name = TENSORPOOL_NAMES.get(a, "CUB")
                cell = lambda b, base: (("%.0f ns" % b["real_time"], "%.2f" % (base["real_time"] / b["real_time"]))
                                        if b and base else ("-", "-"))
                out.append("| %s | %dk | %s | %.0f ns | %s | %s | %s | %s | %s |" % (
                    size_text(size), live // 1000, name, one["real_time"], *cell(same, one),
                    "%.0f ns" % one_own["real_time"] if one_own else "-", *cell(own, one_own)))
    shared = [(a, size) for size in sizes for a in ("tensorpool", "tensorpool-vmm")
              if r.get((a, size, 1000, 1, "shared_segment"))]
    if shared:
        out.append("\nOn one layout (`/shared_segment`: the warm-up caches one block of twice the size on the "
                   "default stream, so that one thread and two split and merge the same block; live 1k):\n")
        out.append("| size | allocator | 1 thread | 2 threads | x 1 thread |")
        out.append("|---|---|---|---|---|")
        for a, size in shared:
            one, two = r.get((a, size, 1000, 1, "shared_segment")), r.get((a, size, 1000, 2, "shared_segment"))
            name = TENSORPOOL_NAMES[a]
            out.append("| %s | %s | %.0f ns | %s | %s |" % (
                size_text(size), name, one["real_time"], "%.0f ns" % two["real_time"] if two else "-",
                "%.2f" % (one["real_time"] / two["real_time"]) if two else "-"))
    out.append("\nThe pair, one thread, the default mode against mode:fixed and CUB (wall time, medians):\n")
    out.append("| size | live | default (vmm) | mode:fixed | default / fixed | default / CUB |")
    out.append("|---|---|---|---|---|---|")
    for size in sizes:
        for live in (1000, 100000):
            v, f, c = (r.get((a, size, live, 1)) for a in ("tensorpool-vmm", "tensorpool", "cub"))
            if v and f and c:
                out.append("| %s | %dk | %.1f ns | %.1f ns | %.2f | %.2f |" % (
                    size_text(size), live // 1000, v["real_time"], f["real_time"], v["real_time"] / f["real_time"],
                    v["real_time"] / c["real_time"]))
    return "\n".join(out) + "\n"


TABLES = {"latency": table_latency, "threads": table_threads, "cub-side-by-side": table_cub, "cub-validation": table_cub_validation, "rmm": table_rmm,
          "empty-cache": table_empty_cache, "gpu": table_gpu, "fit-shared": table_fit_shared,
          "fit-suite": table_fit_suite, "fit-vmm": table_fit_vmm}


def render():
    with open(DOC) as f:
        text = f.read()
    for tid, fn in TABLES.items():
        pattern = re.compile(r"(<!-- table:%s -->\n).*?(<!-- /table:%s -->)" % (re.escape(tid), re.escape(tid)), re.S)
        if not pattern.search(text):
            continue
        body = fn(tid)
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    tmp = DOC + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, DOC)


def main(argv):
    if len(argv) >= 4 and argv[1] == "record" and argv[3] == "--":
        record(argv[2], argv[4:])
    elif len(argv) == 2 and argv[1] == "render":
        render()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
