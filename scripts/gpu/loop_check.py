#!/usr/bin/env python3
"""scripts/gpu/loop_check.py: the generator's PyTorch loop against the same loop run on a GPU.

Runs a small Llama-style model (RMSNorm written out, rotary positions, separate Q/K/V, SwiGLU with
F.silu, untied head, F.cross_entropy) for two optimizer steps in each setup below, in a fresh
process each, with PyTorch's memory history recorded from before the model exists; then compares
the peak of live requested bytes of that snapshot (`tensorpool info --json`) with the peak of the
trace `tensorpool generate` writes for the same setup (docs/workloads.md, "Checked against real
runs"). The model is written the way the generator's framework:pytorch assumes, so a difference is
the generator's error, not a difference of programs.

    scripts/gpu/loop_check.py --out DIR --cli build/tools/tensorpool
    scripts/gpu/loop_check.py --dry-run --cli ...   # no GPU: one CPU step of each setup's model,
                                                    # and the generated peaks

Exit status: 0 every setup within 3%; 1 one is not, or a run failed; 3 skipped (no torch with
CUDA, or no GPU). Output: DIR/loop-check.json, DIR/loop-<setup>.pickle (the snapshots).
"""
import argparse
import json
import math
import os
import subprocess
import sys

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


def options(precision, attention, impl):
    keys = dict(SHAPE, mlp="gated", norm="rmsnorm", biases="false", tied_embeddings="false", positions=0,
                precision=precision, attention=attention, optimizer_impl=impl, loss="cross_entropy",
                activation="fused", qkv="separate")
    return ",".join(f"{k}:{v}" for k, v in keys.items())


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
    import torch.nn.functional as F

    precision, attention, impl = args.child.split("/")
    device = torch.device(args.device)
    s = dict(SHAPE, layers=2, seq=128) if args.dry_run else SHAPE  # a dry run only checks the code runs
    h, heads, f, vocab = s["hidden"], s["heads"], s["ffn"], s["vocab"]
    d = h // heads
    if device.type == "cuda":
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)

    def param(*shape):
        return torch.nn.Parameter(torch.randn(*shape, device=device) * 0.02)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = param(h), param(h)
            self.q, self.k, self.v, self.o = param(h, h), param(h, h), param(h, h), param(h, h)
            self.gate, self.up, self.down = param(f, h), param(f, h), param(h, f)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = param(vocab, h)
            self.layers = torch.nn.ModuleList(Layer() for _ in range(s["layers"]))
            self.final_norm = param(h)
            self.head = param(vocab, h)
            inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
            angles = torch.outer(torch.arange(s["context"], device=device, dtype=torch.float32), inv)
            self.register_buffer("cos", angles.cos())
            self.register_buffer("sin", angles.sin())

    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(x, cos, sin):  # x: [b, s, heads, d]; halves, as the generator writes them
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        cos, sin = cos[:, None, :], sin[:, None, :]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def attend(q, k, v, seq):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, heads, s, d]
        if attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)
            mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool, device=device))
            scores = scores.masked_fill(~mask, float("-inf"))
            shifted = scores - scores.max(dim=-1, keepdim=True).values
            e = torch.exp(shifted)
            out = (e / e.sum(dim=-1, keepdim=True)) @ v
        return out.transpose(1, 2).reshape(out.shape[0], seq, h)

    def forward(model, ids):
        b, seq = ids.shape
        cos, sin = model.cos[:seq], model.sin[:seq]
        x = model.embedding[ids]
        for layer in model.layers:
            n = rms_norm(x, layer.norm1)
            q = rope(F.linear(n, layer.q).view(b, seq, heads, d), cos, sin)
            k = rope(F.linear(n, layer.k).view(b, seq, heads, d), cos, sin)
            v = F.linear(n, layer.v).view(b, seq, heads, d)
            x = x + F.linear(attend(q, k, v, seq), layer.o)
            n = rms_norm(x, layer.norm2)
            x = x + F.linear(F.silu(F.linear(n, layer.gate)) * F.linear(n, layer.up), layer.down)
        return F.linear(rms_norm(x, model.final_norm), model.head)

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=impl == "foreach", fused=impl == "fused")
    autocast = precision.startswith("autocast")
    steps = 1 if args.dry_run else s["steps"]
    for _ in range(steps):
        ids = torch.randint(0, vocab, (s["micro_batch"], s["seq"]), device=device)
        targets = torch.randint(0, vocab, (s["micro_batch"], s["seq"]), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = forward(model, ids)
            loss = F.cross_entropy(logits.view(-1, vocab), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.memory._dump_snapshot(args.snapshot)
    print(f"loss {loss.item():.4f}")


# --- the parent -------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="loop-check")
    ap.add_argument("--cli", default="build/tools/tensorpool")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--snapshot", help=argparse.SUPPRESS)
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
        rows.append(row)
        shown = f"{row['error_pct']:+.2f}%" if "error_pct" in row else row.get("error", "(not run on a GPU)")
        print(f"loop_check {name}: generated {predicted:,} measured {row.get('measured_peak_bytes', '-')} {shown}")
    with open(os.path.join(args.out, "loop-check.json"), "w") as out:
        json.dump({"shape": SHAPE, "tolerance": TOLERANCE, "setups": rows}, out, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
