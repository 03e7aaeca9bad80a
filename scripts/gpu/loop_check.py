#!/usr/bin/env python3
"""scripts/gpu/loop_check.py: the generator's PyTorch loop against the same loop run on a GPU.

Runs a small Llama-style model (tests/python/loop_model.py: RMSNorm written out, rotary positions,
separate Q/K/V, SwiGLU with F.silu, untied head, F.cross_entropy) for two optimizer steps in each setup below, in a fresh
process each, with PyTorch's memory history recorded from before the model exists; then compares
the peak of live requested bytes of that snapshot (`tensorpool info --json`) with the peak of the
trace `tensorpool generate` writes for the same setup (docs/workloads.md, "Checked against real
runs"). The model is written the way the generator's framework:pytorch assumes, so a difference is
the generator's error, not a difference of programs. The same run is also captured without the
GPU (python -m tensorpool.capture, docs/capture.md), and the capture's peak set against both.

    scripts/gpu/loop_check.py --out DIR --cli build/tools/tensorpool
    scripts/gpu/loop_check.py --dry-run --cli ...   # no GPU: one CPU step of each setup's model,
                                                    # and the generated peaks

Exit status: 0 every setup within 3% (the generated and the captured peak against the measured
one); 1 one is not, or a run failed; 3 skipped (no torch with CUDA, or no GPU). Output:
DIR/loop-check.json, DIR/loop-<setup>.pickle (the snapshots), DIR/loop-<setup>-capture.jsonl (the
captures).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The model and the batch (the generator's keys); small enough for any GPU, large enough that the
# CUDA libraries' own allocations (cuBLAS workspaces) are well under 1% of the peak.
SHAPE = {"layers": 8, "hidden": 1024, "heads": 16, "kv_heads": 16, "ffn": 2816, "vocab": 32000,
         "micro_batch": 4, "seq": 1024, "context": 1024, "steps": 2}
# (name, precision, attention, optimizer_impl)
SETUPS = [
    ("autocast-sdpa-foreach", "autocast-bf16", "sdpa", "foreach"),
    ("autocast-eager-fused", "autocast-bf16", "eager", "fused"),
    ("fp32-eager-forloop", "fp32", "eager", "for-loop"),
]
TOLERANCE = 0.03


def option_keys(precision, attention, impl):
    return dict(SHAPE, mlp="gated", norm="rmsnorm", biases="false", tied_embeddings="false", positions=0,
                precision=precision, attention=attention, optimizer_impl=impl, loss="cross_entropy",
                activation="fused", qkv="separate")


def options(precision, attention, impl):
    return ",".join(f"{k}:{v}" for k, v in option_keys(precision, attention, impl).items())


def generated_peak(cli, work, name, opts):
    trace = os.path.join(work, f"loop-{name}.tptrace")
    subprocess.run([cli, "generate", trace, "--model", "custom", "--options", opts], check=True,
                   capture_output=True)
    return trace_peak(cli, trace)


def trace_peak(cli, path):
    out = subprocess.run([cli, "info", path, "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out)["peak_requested_bytes"]


# --- the child: one setup's run, on the device ------------------------------------------------

def run_child(args):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from loop_model import LoopModel  # the model the CPU check of the same rules uses

    precision, attention, impl = args.child.split("/")
    device = torch.device(args.device)
    keys = dict(option_keys(precision, attention, impl))
    if args.dry_run:  # a dry run only checks that the code runs
        keys.update(layers=2, seq=128)
    recording = device.type == "cuda" and not args.captured
    if recording:
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    torch.manual_seed(0)
    model = LoopModel(keys, device)
    opt = torch.optim.AdamW(model.params, lr=1e-4, foreach=impl == "foreach", fused=impl == "fused")
    autocast = precision.startswith("autocast")
    shape = (keys["micro_batch"], keys["seq"])
    for _ in range(1 if args.dry_run else keys["steps"]):
        ids = torch.randint(0, keys["vocab"], shape, device=device)
        targets = torch.randint(0, keys["vocab"], shape, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model.forward(ids)
            loss = model.loss(logits, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if recording:
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(args.snapshot)
    print(f"loss {loss.item():.4f}")


# --- the parent -------------------------------------------------------------------------------

def capture_peak(args, name, child, row):
    """The peak of the same run captured on this host's CPU (tensorpool.capture), or None."""
    trace = os.path.join(args.out, f"loop-{name}-capture.jsonl")
    cmd = [sys.executable, "-m", "tensorpool.capture", "--out", trace, "--steps", "0", os.path.abspath(__file__),
           "--child", child, "--device", "cuda", "--captured"] + (["--dry-run"] if args.dry_run else [])
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        row["capture_error"] = (done.stdout + done.stderr).strip()[-2000:]
        return None
    row["captured_peak_bytes"] = trace_peak(args.cli, trace)
    return row["captured_peak_bytes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="loop-check")
    ap.add_argument("--cli", default="build/tools/tensorpool")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--snapshot", help=argparse.SUPPRESS)
    ap.add_argument("--captured", action="store_true", help=argparse.SUPPRESS)  # run by tensorpool.capture
    args = ap.parse_args()
    if args.child:
        run_child(args)
        return 0
    if not os.access(args.cli, os.X_OK):
        print(f"loop_check: no CLI at {args.cli}", file=sys.stderr)
        return 1
    os.makedirs(args.out, exist_ok=True)
    try:
        import torch
        has_gpu = torch.cuda.is_available()
    except ImportError:
        torch, has_gpu = None, False
    if args.dry_run:
        args.device = "cpu"
    elif not has_gpu:
        print("loop_check: skipped (no torch with CUDA, or no GPU)")
        return 3
    rows, failed = [], False
    for name, precision, attention, impl in SETUPS:
        opts = options(precision, attention, impl)
        predicted = generated_peak(args.cli, args.out, name, opts)
        row = {"setup": name, "options": opts, "generated_peak_bytes": predicted}
        if torch is not None:
            snapshot = os.path.join(args.out, f"loop-{name}.pickle")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{precision}/{attention}/{impl}",
                   "--device", args.device, "--snapshot", snapshot] + (["--dry-run"] if args.dry_run else [])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            row["child"] = (done.stdout + done.stderr).strip()[-2000:]
            if done.returncode != 0:
                failed = True
                row["error"] = f"exit {done.returncode}"
            elif not args.dry_run:
                real = trace_peak(args.cli, snapshot)
                row["measured_peak_bytes"] = real
                row["error_pct"] = round(100.0 * (predicted / real - 1.0), 3)
                failed |= abs(predicted / real - 1.0) > TOLERANCE
            captured = capture_peak(args, name, f"{precision}/{attention}/{impl}", row)
            if captured is not None and "measured_peak_bytes" in row:
                row["capture_error_pct"] = round(100.0 * (captured / row["measured_peak_bytes"] - 1.0), 3)
                failed |= abs(captured / row["measured_peak_bytes"] - 1.0) > TOLERANCE
        rows.append(row)
        shown = f"{row['error_pct']:+.2f}%" if "error_pct" in row else row.get("error", "(not run on a GPU)")
        shown_capture = f" ({row['capture_error_pct']:+.2f}%)" if "capture_error_pct" in row else ""
        print(f"loop_check {name}: generated {predicted:,} measured {row.get('measured_peak_bytes', '-')} {shown}; "
              f"captured {row.get('captured_peak_bytes', '-')}{shown_capture}")
    with open(os.path.join(args.out, "loop-check.json"), "w") as out:
        json.dump({"shape": SHAPE, "tolerance": TOLERANCE, "setups": rows}, out, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
