"""tests/python/cs336_train.py: a training script written as the CS336 runs behind the shared
trace cs336-medium-seq128-train.pickle were (../shared/traces/README.md, "The jobs behind three of
them"): the handout's Transformer LM (tests/python/loop_model.py with its keys: RMSNorm, SwiGLU
written out, rotary positions, attention and cross-entropy written out, untied head, vocabulary
10,000) at batch 4 x context 128, and the authors' own AdamW, whose moments appear at the first
step and whose update makes new tensors. Captured by tests/python/test_capture_real_run.py.

    python cs336_train.py [--size medium|2.7b|1.1b] [--precision autocast-bf16|fp32] [--steps N] [--batch N]
                          [--context N] [--forward-only] [--empty-cache]

--forward-only runs each step's forward pass alone, without gradients (no backward, no optimizer);
--empty-cache calls torch.cuda.empty_cache() at each step's start.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loop_model import LoopModel  # noqa: E402

SIZES = {"medium": dict(layers=24, hidden=1024, heads=16, kv_heads=16, ffn=4096),
         "2.7b": dict(layers=32, hidden=2560, heads=32, kv_heads=32, ffn=10240),
         # TinyLlama-1.1B's shape (1,100,048,384 parameters): for the capture's time per step
         "1.1b": dict(layers=22, hidden=2048, heads=32, kv_heads=4, ffn=5632, vocab=32000)}
HANDOUT = dict(mlp="gated", norm="rmsnorm", biases="false", tied_embeddings="false", positions=0, vocab=10000,
               attention="eager", loss="written", activation="written", qkv="separate", context=128)


class AdamW(torch.optim.Optimizer):
    """The handout's AdamW as the runs wrote it: m and v replaced by new tensors at each step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                t = state.get("t", 0) + 1
                m = state.get("m", torch.zeros_like(p))
                v = state.get("v", torch.zeros_like(p))
                g = p.grad
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                alpha = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                p -= alpha * m / (torch.sqrt(v) + eps)
                p -= lr * wd * p
                state["t"], state["m"], state["v"] = t, m, v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=sorted(SIZES), default="medium")
    ap.add_argument("--precision", choices=["autocast-bf16", "fp32"], default="autocast-bf16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=HANDOUT["context"])
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--empty-cache", action="store_true")
    a = ap.parse_args()
    keys = dict(HANDOUT, **SIZES[a.size], context=a.context)
    model = LoopModel(keys, device="cuda")
    optimizer = AdamW(model.params)
    autocast = a.precision == "autocast-bf16"
    for _ in range(a.steps):
        if a.empty_cache:
            torch.cuda.empty_cache()
        x = torch.randint(0, keys["vocab"], (a.batch, keys["context"]), device="cuda")
        if a.forward_only:
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                logits = model.forward(x)
            del logits
            continue
        y = torch.randint(0, keys["vocab"], (a.batch, keys["context"]), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model.forward(x)
            loss = model.loss(logits, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
