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
an interpreter that has it, or the project's .venv-torch has it (`scripts/install-deps.sh torch`;
then the test runs there).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

CLI = sys.argv[1] if len(sys.argv) > 1 else "build/tools/tensorpool"

from torch_here import torch  # noqa: E402 (runs the test where torch is, or skips it)

from loop_model import LoopModel  # noqa: E402 (needs torch)

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
    model = LoopModel(k)
    saved = {}

    def pack(t):
        s = t.untyped_storage()
        saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ids = torch.randint(0, k["vocab"], (k["micro_batch"], k["seq"]))
        targets = torch.randint(0, k["vocab"], (k["micro_batch"], k["seq"]))
        logits = model.forward(ids)
        loss = model.loss(logits, targets)
    held = [logits, loss, ids]
    excluded = {t.untyped_storage().data_ptr() for t in model.params + model.buffers}
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
