#!/usr/bin/env python3
"""tests/python/test_loop_rules.py: the generator's PyTorch loop against PyTorch's own autograd.

For several models written the way framework:pytorch assumes (Llama-style and GPT-2-style blocks;
eager or sdpa attention; written-out or library activation and loss; separate, fused or grouped
Q/K/V; fp32, and one in bf16), one forward pass and loss run on the CPU with torch.autograd.graph's
saved_tensors_hooks recording every storage autograd keeps. What autograd keeps, with what the
loop still references (the logits, the loss, the input ids), must equal, within 1%, what the
generated trace has live when its backward pass begins, less the parameters and buffers (the same
on both sides). No GPU is needed: what autograd saves does not depend on the device (the CPU's
sdpa kernel keeps what the CUDA ones do, with a log-sum-exp unpadded: the sequences here are
multiples of 32).

    tests/python/test_loop_rules.py TENSORPOOL_CLI

Needs torch: exits 77 (skipped) where it cannot be imported, unless TENSORPOOL_TORCH_PYTHON names
an interpreter that has it (then the test runs there).
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

CLI = sys.argv[1] if len(sys.argv) > 1 else "build/tools/tensorpool"

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    other = os.environ.get("TENSORPOOL_TORCH_PYTHON")
    if other and os.path.abspath(other) != os.path.abspath(sys.executable):
        os.execv(other, [other] + sys.argv)
    print("skipped: no torch here (set TENSORPOOL_TORCH_PYTHON to an interpreter that has it)")
    sys.exit(77)

BASE = {"layers": 2, "hidden": 256, "heads": 8, "kv_heads": 8, "ffn": 512, "vocab": 1000,
        "micro_batch": 2, "seq": 128, "context": 128, "steps": 1, "precision": "fp32"}
LLAMA = {"mlp": "gated", "norm": "rmsnorm", "biases": "false", "tied_embeddings": "false", "positions": 0}
GPT2 = {"mlp": "gelu", "norm": "layernorm", "biases": "true", "tied_embeddings": "true", "positions": 128,
        "dropout": "false", "qkv": "fused"}
CASES = {
    "llama-eager-written": dict(LLAMA, attention="eager", activation="written", loss="written"),
    "llama-sdpa-library": dict(LLAMA, attention="sdpa", activation="fused", loss="cross_entropy"),
    "llama-gqa-sdpa": dict(LLAMA, attention="sdpa", kv_heads=2),
    "llama-fused-qkv-eager": dict(LLAMA, attention="eager", qkv="fused"),
    "gpt2-sdpa": dict(GPT2, attention="sdpa"),
    "gpt2-eager-written": dict(GPT2, attention="eager", activation="written", loss="written"),
    "llama-bf16-eager": dict(LLAMA, attention="eager", precision="bf16"),
}


def options(case):
    keys = dict(BASE, **case)
    return keys, ",".join(f"{k}:{v}" for k, v in keys.items())


def generated_before_backward(opts):
    """Live bytes of the generated trace, less weights, buffers and model states, before its
    backward pass."""
    with tempfile.TemporaryDirectory() as work:
        trace = os.path.join(work, "t.tptrace")
        lines = os.path.join(work, "t.jsonl")
        subprocess.run([CLI, "generate", trace, "--model", "custom", "--options", opts], check=True, capture_output=True)
        subprocess.run([CLI, "convert", trace, lines], check=True, capture_output=True)
        live = {}
        with open(lines) as f:
            for line in f:
                e = json.loads(line)
                if e.get("op") == "alloc":
                    if e["label"] == "temporaries:backward.grad_output":
                        break
                    live[e["addr"]] = (e["size"], e["label"])
                elif e.get("op") == "free_requested":
                    live.pop(e["addr"], None)
        # less the model states (precision:bf16's fp32 master copy is made with the weights)
        return sum(size for size, label in live.values() if not label.startswith(("weights:", "optimizer:")))


def autograd_keeps(k):
    """What autograd saves in one forward pass and loss, with what the loop holds, less parameters
    and buffers: bytes of distinct storages."""
    torch.manual_seed(0)
    h, heads, kv_heads, f, vocab = k["hidden"], k["heads"], k["kv_heads"], k["ffn"], k["vocab"]
    b, seq = k["micro_batch"], k["seq"]
    d, kv = h // heads, h // heads * kv_heads
    gated, rms, biases = k["mlp"] == "gated", k["norm"] == "rmsnorm", k["biases"] == "true"
    fused_qkv = k.get("qkv") == "fused"
    params, buffers = [], []

    dtype = torch.bfloat16 if k["precision"] == "bf16" else torch.float32  # bf16: the model in 16 bits

    def p(*shape):
        t = torch.nn.Parameter((torch.randn(*shape) * 0.02).to(dtype))
        params.append(t)
        return t

    def bias(n):
        return p(n) if biases else None

    def norm_params():
        return (p(h), None if rms else p(h))

    layers = []
    for _ in range(k["layers"]):
        w = {"n1": norm_params(), "n2": norm_params(), "o": (p(h, h), bias(h))}
        if fused_qkv:
            w["qkv"] = (p(h + 2 * kv, h), bias(h + 2 * kv))
        else:
            w["q"], w["k"], w["v"] = (p(h, h), bias(h)), (p(kv, h), bias(kv)), (p(kv, h), bias(kv))
        if gated:
            w["gate"] = (p(f, h), None)
        w["up"], w["down"] = (p(f, h), bias(f)), (p(h, f), bias(h))
        layers.append(w)
    emb = p(vocab, h)
    pos = p(k["positions"], h) if k["positions"] else None
    final = norm_params()
    head = emb if k["tied_embeddings"] == "true" else p(vocab, h)
    cos = sin = None
    if pos is None:  # rotary positions
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        angles = torch.outer(torch.arange(k["context"]).float(), inv)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)  # buffers: model.to(dtype) casts them
        buffers += [cos, sin]

    def norm(x, w):
        if rms:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w[0]
        return F.layer_norm(x, (h,), w[0], w[1])

    def rope(x):  # [b, s, n, d]: halves
        if cos is None:
            return x
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        c, s = cos[:seq, None, :], sin[:seq, None, :]
        return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)

    def repeat_kv(x):  # [b, s, kv_heads, d] -> [b, s, heads, d], a copy (Hugging Face's repeat_kv)
        if kv_heads == heads:
            return x
        return x[:, :, :, None, :].expand(b, seq, kv_heads, heads // kv_heads, d).reshape(b, seq, heads, d)

    def activation(x, name):
        if k.get("activation") == "written":
            if gated:
                return x * torch.sigmoid(x)
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x.pow(3))
            return 0.5 * x * (1 + torch.tanh(inner))
        return F.silu(x) if gated else F.gelu(x, approximate="tanh")

    def attend(q, k_, v):
        q, k_, v = (t.transpose(1, 2) for t in (q, k_, v))
        if k["attention"] == "sdpa":
            out = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
        else:
            scores = q @ k_.transpose(-2, -1) / math.sqrt(d)
            mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool))
            scores = scores.masked_fill(~mask, float("-inf"))
            shifted = scores - scores.max(dim=-1, keepdim=True).values
            e = torch.exp(shifted)
            out = (e / e.sum(dim=-1, keepdim=True)) @ v
        return out.transpose(1, 2).reshape(b, seq, h)

    def loss_of(logits, targets):
        flat = logits.view(-1, vocab)
        if k.get("loss") == "written":
            shifted = flat - flat.max(dim=-1, keepdim=True).values
            lse = torch.log(torch.exp(shifted).sum(dim=-1))
            return (lse - shifted.gather(-1, targets.view(-1, 1)).squeeze(-1)).mean()
        return F.cross_entropy(flat, targets.view(-1))

    saved = {}

    def pack(t):
        s = t.untyped_storage()
        saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ids = torch.randint(0, vocab, (b, seq))
        targets = torch.randint(0, vocab, (b, seq))
        x = emb[ids]
        if pos is not None:
            x = x + pos[torch.arange(seq)]
        for w in layers:
            n = norm(x, w["n1"])
            if fused_qkv:
                q, k_, v = F.linear(n, *w["qkv"]).split([h, kv, kv], dim=-1)
            else:
                q, k_, v = F.linear(n, *w["q"]), F.linear(n, *w["k"]), F.linear(n, *w["v"])
            q = rope(q.reshape(b, seq, heads, d))
            k_ = repeat_kv(rope(k_.reshape(b, seq, kv_heads, d)))
            v = repeat_kv(v.reshape(b, seq, kv_heads, d))
            x = x + F.linear(attend(q, k_, v), *w["o"])
            n = norm(x, w["n2"])
            up = F.linear(n, *w["up"])
            inner = activation(F.linear(n, *w["gate"]), "silu") * up if gated else activation(up, "gelu")
            x = x + F.linear(inner, *w["down"])
        logits = F.linear(norm(x, final), head)
        loss = loss_of(logits, targets)
    held = [logits, loss, ids]
    excluded = {t.untyped_storage().data_ptr() for t in params + buffers}
    storages = dict(saved)
    for t in held:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(n for ptr, n in storages.items() if ptr not in excluded)


class LoopRules(unittest.TestCase):
    def test_what_autograd_keeps(self):
        for name, case in CASES.items():
            with self.subTest(case=name):
                keys, opts = options(case)
                real = autograd_keeps(keys)
                generated = generated_before_backward(opts)
                error = generated / real - 1.0
                print(f"{name}: autograd keeps {real:,} bytes, the generated trace {generated:,} ({100 * error:+.2f}%)")
                self.assertLessEqual(abs(error), 0.01, f"{name}: {opts}")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
