#!/usr/bin/env python3
"""scripts/gpu/torch_check.py: PyTorch with tensorpool against PyTorch's own allocator, on a GPU.

Trains a small transformer (bf16 autocast, AdamW, a few steps, fixed seed and data) once per
variant, each in a fresh process (an allocator can only be installed before CUDA starts):
  pytorch            PyTorch's native caching allocator
  tensorpool-async   tensorpool.install("backend:async")
  tensorpool-malloc  tensorpool.install("backend:malloc")
  tensorpool-vmm     tensorpool.install("backend:vmm,mode:vmm")
  tensorpool-vmm-steps  the same, with tensorpool.step_after_optimizer() (a step boundary after
                     every optimizer.step(); docs/vmm.md, "Steps")
and checks that every variant's losses agree with PyTorch's to bf16 tolerance (deterministic
kernels are requested, so they should agree to the bit; the tolerance covers kernels that are
not). Prints, for docs/benchmarks.md, each variant's peak reserved and allocated bytes and
its median step time, and what the step boundaries changed: the loop keeps its logits and loss
over the boundary (Python rebinds them only in the next step), so its steps follow no plan for a
while, and such steps must hold what the loop holds without them (docs/benchmarks.md, "Steps that
follow no plan"; replayed, they hold the same bytes with the same calls). The tensorpool-async
run also records its history, dumps a snapshot and renders it with torch.cuda._memory_viz; every
tensorpool run ends with an OOM probe that records what PyTorch does when the allocator returns
nullptr.

    scripts/gpu/torch_check.py --out DIR --library build/cuda/libtensorpool_torch.so
    scripts/gpu/torch_check.py --dry-run ...   # no GPU, no torch needed: checks the setup,
                                               # prints the plan; with torch, one CPU step

Then two probes, each in a fresh process: "mempool" (no install; TENSORPOOL_CONF=backend:vmm): a
KV cache made in tensorpool.mem_pool(tag="kv_cache") under torch.cuda.use_mem_pool is put to
sleep with its contents kept (the GPU's free memory must grow by what sleeps) and woken (its
bytes must come back), beside a tensor of PyTorch's own allocator; "graph" (tensorpool installed,
backend:vmm): torch.cuda.graph captured after tensorpool.begin_capture, replayed, with whatever
PyTorch does there recorded (a pluggable allocator cannot take PyTorch's pool hooks from Python).

Exit status: 0 all variants ran and agree; 1 a variant failed or disagrees; 3 skipped (no torch
with CUDA, or no GPU). Output: DIR/torch-check.json, DIR/torch-<variant>.log.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIANTS = {
    "pytorch": None,
    "tensorpool-async": "backend:async",
    "tensorpool-malloc": "backend:malloc",
    "tensorpool-vmm": "backend:vmm,mode:vmm",
    "tensorpool-vmm-steps": "backend:vmm,mode:vmm",  # and tensorpool.step_after_optimizer()
}
# bf16 keeps 8 bits of mantissa: two runs that differ only in reduction order agree to a few
# units in the last place of the loss.
LOSS_RTOL = 2e-2
SKIPPED = 3


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for the logs and torch-check.json")
    p.add_argument("--library", default=os.path.join(ROOT, "build", "cuda", "libtensorpool_torch.so"))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dry-run", action="store_true", help="check the setup and print the plan")
    p.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)  # child mode
    p.add_argument("--probe", choices=sorted(PROBES), help=argparse.SUPPRESS)  # child mode
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    return p.parse_args()


# --- the training run (child process) --------------------------------------------------------

def train(args):
    """Runs one variant; returns its figures as a dict."""
    conf = VARIANTS[args.variant]
    if conf is not None:
        import tensorpool
        tensorpool.install(conf)
        if args.variant.endswith("-steps"):
            tensorpool.step_after_optimizer()
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    device = torch.device(args.device)

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.hidden)
            layer = nn.TransformerEncoderLayer(args.hidden, nhead=8, dim_feedforward=4 * args.hidden,
                                               dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, num_layers=args.layers)
            self.head = nn.Linear(args.hidden, args.vocab)

        def forward(self, tokens):
            mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
            return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))

    model = TinyLM().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=data)
               for _ in range(args.steps)]
    use_cuda = device.type == "cuda"
    if conf is not None and args.variant == "tensorpool-async":
        tensorpool.record_history(True)
    losses, times = [], []
    for tokens in batches:
        tokens = tokens.to(device)
        if use_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, args.vocab),
                                               tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if use_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    result = {"variant": args.variant, "losses": losses, "step_s": times}
    if not use_cuda:
        return result
    if conf is None:
        result["peak_reserved"] = torch.cuda.max_memory_reserved()
        result["peak_allocated"] = torch.cuda.max_memory_allocated()
        return result
    stats = tensorpool.memory_stats()
    result["peak_reserved"] = stats["reserved_bytes.all.peak"]
    result["peak_allocated"] = stats["allocated_bytes.all.peak"]
    result["num_device_alloc"] = stats["num_device_alloc"]
    result["num_sync_all_streams"] = stats["num_sync_all_streams"]
    if args.variant == "tensorpool-async":
        result["snapshot"] = check_snapshot(args, tensorpool)
    result["oom_probe"] = oom_probe(torch, tensorpool)
    return result


# --- the probes (child processes) -------------------------------------------------------------

def mempool_probe():
    """A KV cache in a torch.cuda.MemPool of tensorpool's sleeps (contents kept) and wakes."""
    import tensorpool
    import torch
    pool = tensorpool.mem_pool(tag="kv_cache")
    with torch.cuda.use_mem_pool(pool):
        kv = torch.full((256, 1024, 1024), 7, dtype=torch.uint8, device="cuda")  # 256 MiB
    other = torch.ones(1024, 1024, device="cuda")  # PyTorch's own allocator
    torch.cuda.synchronize()
    free_before, _ = torch.cuda.mem_get_info()
    report = tensorpool.sleep(tag="kv_cache", keep_contents=True)
    free_asleep, _ = torch.cuda.mem_get_info()
    try:
        kv_asleep = tensorpool.is_asleep(kv)
    except Exception as e:  # noqa: BLE001  (the tensor may not start its pool's segment)
        kv_asleep = f"not asked: {e}"
    tensorpool.wake(tag="kv_cache")
    result = {"asleep_bytes": report["asleep_bytes"], "freed_by_sleep": free_asleep - free_before,
              "kv_asleep": kv_asleep, "kv_kept": bool((kv == 7).all().item()),
              "other_intact": bool((other == 1).all().item())}
    result["ok"] = (result["freed_by_sleep"] >= report["asleep_bytes"] >= 256 * 2**20 and result["kv_kept"]
                    and result["other_intact"])
    return result


def graph_probe():
    """torch.cuda.graph with tensorpool installed, the stream's graph pool begun first."""
    import tensorpool
    tensorpool.install("backend:vmm")
    import torch
    x = torch.ones(1024, 1024, device="cuda")
    stream = torch.cuda.Stream()
    result = {}
    try:
        pool = tensorpool.begin_capture(stream, 256 * 2**20)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            y = x * 2 + 1
        tensorpool.end_capture(stream)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        result["replayed"] = bool((y == 3).all().item())
        result["graph_pools"] = tensorpool.graph_pools()
        del graph, y
        tensorpool.release_graph(pool)
        result["ok"] = result["replayed"]
    except Exception as e:  # noqa: BLE001  what PyTorch does is the finding
        result["error"] = f"{type(e).__name__}: {e}"
        result["ok"] = False
    return result


PROBES = {"mempool": ("backend:vmm", mempool_probe), "graph": (None, graph_probe)}


def check_snapshot(args, tensorpool):
    """Dumps the recorded history and renders it with torch.cuda._memory_viz."""
    import pickle
    from torch.cuda import _memory_viz

    path = os.path.join(args.out, "tensorpool-async-snapshot.pickle")
    tensorpool.dump_snapshot(path)

    class NoGlobals(pickle.Unpickler):
        def find_class(self, module, name):
            raise pickle.UnpicklingError(f"global {module}.{name}")

    with open(path, "rb") as f:
        data = NoGlobals(f).load()
    for name, render in (("trace_plot", _memory_viz.trace_plot), ("segment_plot", _memory_viz.segment_plot)):
        with open(os.path.join(args.out, f"tensorpool-async-{name}.html"), "w") as f:
            f.write(render(data))
    _memory_viz.segsum(data)
    return {"path": path, "events": len(data["device_traces"][0]), "segments": len(data["segments"])}


def oom_probe(torch, tensorpool):
    """What PyTorch does when tensorpool_torch_malloc returns nullptr (PyTorch's pluggable
    allocator does not check the pointer in the sources read: see docs/pytorch.md)."""
    tensorpool.set_memory_fraction(0.01)
    try:
        t = torch.empty(1 << 34, dtype=torch.uint8, device="cuda")  # 16 GiB
        outcome = f"no exception; data_ptr {t.data_ptr():#x}"
        del t
    except Exception as e:  # noqa: BLE001: recording whatever PyTorch raises is the point
        outcome = f"{type(e).__module__}.{type(e).__name__}: {str(e)[:200]}"
    finally:
        tensorpool.set_memory_fraction(1.0)
    return outcome


# --- the driver ------------------------------------------------------------------------------

def median_ms(times):
    return 1000 * statistics.median(times[1:] if len(times) > 1 else times)  # step 1 warms up


def compare(results):
    base = results["pytorch"]["losses"]
    rows, ok = [], True
    for name, r in results.items():
        worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(r["losses"], base))
        agree = worst <= LOSS_RTOL and len(r["losses"]) == len(base)
        ok = ok and agree
        rows.append((name, r["losses"][-1], worst, agree, r.get("peak_reserved", 0),
                     r.get("peak_allocated", 0), median_ms(r["step_s"])))
    return rows, ok


def print_table(rows):
    print(f"{'variant':<18} {'final loss':>10} {'max rel dloss':>13} {'agree':>5} "
          f"{'peak reserved':>14} {'peak allocated':>14} {'median step':>11}")
    for name, loss, worst, agree, reserved, allocated, ms in rows:
        print(f"{name:<18} {loss:>10.5f} {worst:>13.2e} {'yes' if agree else 'NO':>5} "
              f"{reserved / 2**20:>10.1f} MiB {allocated / 2**20:>10.1f} MiB {ms:>8.2f} ms")


def dry_run(args):
    print(f"torch_check: dry run; library {args.library}")
    problems = []
    if not os.path.exists(args.library):
        problems.append(f"{args.library} does not exist (build the tensorpool_torch target)")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    try:
        import tensorpool  # noqa: F401
    except Exception as e:  # noqa: BLE001
        problems.append(f"the tensorpool module does not import: {e}")
    for name, conf in VARIANTS.items():
        how = "PyTorch's allocator" if conf is None else f"tensorpool.install({conf!r})"
        if name.endswith("-steps"):
            how += " + step_after_optimizer()"
        print(f"  would run {name:<18} {how}, {args.steps} steps of a {args.layers}-layer "
              f"transformer (hidden {args.hidden}, batch {args.batch}, seq {args.seq}, bf16)")
    for name, (conf, probe) in PROBES.items():
        print(f"  would probe {name:<8} {probe.__doc__}")
    try:
        import torch  # noqa: F401
        have_torch = True
    except Exception:  # noqa: BLE001
        have_torch = False
    if have_torch:  # the training code itself: two steps of a tiny model on the CPU
        cpu = argparse.Namespace(**vars(args))
        cpu.variant, cpu.device, cpu.steps = "pytorch", "cpu", 2
        cpu.layers, cpu.hidden, cpu.batch, cpu.seq, cpu.vocab = 1, 64, 2, 16, 256
        r = train(cpu)
        rows, agree = compare({"pytorch": r, "pytorch-again": train(cpu)})
        print_table(rows)
        if not agree:
            problems.append("two CPU runs of the same training disagree")
    else:
        print("  torch is not importable here: the training code was not run")
    for p in problems:
        print(f"torch_check: problem: {p}")
    return 1 if problems else 0


def run_probes(args, env):
    """Each probe in a process of its own; its dict (with "ok"), or what went wrong."""
    probes = {}
    for name, (conf, _) in PROBES.items():
        penv = dict(env)
        if conf is not None:
            penv["TENSORPOOL_CONF"] = conf
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe", name, "--out", args.out],
                              env=penv, capture_output=True, text=True, timeout=300)
        with open(os.path.join(args.out, f"torch-probe-{name}.log"), "w") as f:
            f.write(proc.stdout + proc.stderr)
        try:
            probes[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            probes[name] = {"ok": False, "error": f"exit {proc.returncode}; see torch-probe-{name}.log"}
        print(f"  probe {name}: {probes[name]}")
    return probes


def main():
    args = parse_args()
    if args.variant:  # child
        os.makedirs(args.out, exist_ok=True)
        print(json.dumps(train(args)))
        return 0
    if args.probe:  # child
        print(json.dumps(PROBES[args.probe][1](), default=str))
        return 0
    if args.dry_run:
        return dry_run(args)
    os.makedirs(args.out, exist_ok=True)
    try:
        import torch
        if not torch.cuda.is_available():
            print("torch_check: SKIPPED: torch sees no CUDA device")
            return SKIPPED
    except ImportError:
        print("torch_check: SKIPPED: torch is not installed")
        return SKIPPED
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "python"), env.get("PYTHONPATH", "")])
    env["TENSORPOOL_LIBRARY"] = os.path.abspath(args.library)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS
    env.pop("TENSORPOOL_CONF", None)
    results, failed = {}, []
    for name in VARIANTS:
        cmd = [sys.executable, os.path.abspath(__file__), "--variant", name, "--out", args.out,
               "--steps", str(args.steps), "--layers", str(args.layers), "--hidden", str(args.hidden),
               "--batch", str(args.batch), "--seq", str(args.seq), "--vocab", str(args.vocab)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        with open(os.path.join(args.out, f"torch-{name}.log"), "w") as f:
            f.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            failed.append(name)
            print(f"torch_check: {name} FAILED (exit {proc.returncode}); see torch-{name}.log")
            continue
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    ok = not failed and "pytorch" in results
    if "pytorch" in results:
        rows, agree = compare(results)
        ok = ok and agree
        print_table(rows)
        for name, r in results.items():
            if "oom_probe" in r:
                print(f"  {name}: OOM probe (16 GiB under a 1% memory fraction): {r['oom_probe']}")
            if "snapshot" in r:
                print(f"  {name}: snapshot {r['snapshot']['path']}: {r['snapshot']['events']} events, "
                      f"rendered by torch.cuda._memory_viz")
    steps, plain = results.get("tensorpool-vmm-steps"), results.get("tensorpool-vmm")
    if steps and plain:  # reported, not judged: a real run's planner thread makes its timing
        print(f"  tensorpool-vmm-steps: peak reserved {steps['peak_reserved'] / 2**20:.1f} MiB against "
              f"{plain['peak_reserved'] / 2**20:.1f} without step boundaries; device calls "
              f"{steps['num_device_alloc']} against {plain['num_device_alloc']}; synchronizations "
              f"{steps['num_sync_all_streams']} against {plain['num_sync_all_streams']}")
    probes = run_probes(args, env)
    ok = ok and all(p.get("ok") for p in probes.values())
    with open(os.path.join(args.out, "torch-check.json"), "w") as f:
        json.dump({"results": results, "failed": failed, "agree": ok, "probes": probes}, f, indent=2, default=str)
    print(f"torch_check: {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
