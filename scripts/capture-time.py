#!/usr/bin/env python3
"""scripts/capture-time.py: how long tensorpool.capture takes per training step (docs/benchmarks.md,
"Capturing a job without a GPU"), for the test model of tests/python/test_capture.py and for the
models of tests/python/cs336_train.py (CS336 medium; TinyLlama-1.1B's shape). Each script is
captured once to warm up (torch's first FakeTensorMode use, the autocast kernels' registration),
then for 1 and for 4 optimizer steps; the time per step is the difference over 3, the median of
3 rounds. Run it on one core for the documented figures:

    taskset -c 0 .venv-torch/bin/python scripts/capture-time.py
"""
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from tensorpool import capture  # noqa: E402

import torch  # noqa: E402

TRAIN = os.path.join(ROOT, "tests", "python", "cs336_train.py")
TEST_MODEL = '''
import sys, torch
sys.path.insert(0, {here!r})
from loop_model import LoopModel
keys = dict(layers=2, hidden=256, heads=8, kv_heads=8, ffn=512, vocab=1000, micro_batch=2, seq=128, context=128,
            mlp="gated", norm="rmsnorm", biases="false", tied_embeddings="false", positions=0, attention="sdpa",
            loss="cross_entropy")
model = LoopModel(keys, device="cuda")
opt = torch.optim.AdamW(model.params)
for _ in range(100):
    ids = torch.randint(0, 1000, (2, 128), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.loss(model.forward(ids), ids)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''


def timed(script, args, steps):
    start = time.perf_counter()
    result = capture.run_script(script, args, steps=steps)
    return time.perf_counter() - start, result


def main():
    test_model = os.path.join(os.environ.get("TMPDIR", "/tmp"), "tensorpool_capture_test_model.py")
    with open(test_model, "w") as f:
        f.write(TEST_MODEL.format(here=os.path.join(ROOT, "tests", "python")))
    jobs = [("the test model (2 layers, hidden 256; 7.3 MB of weights)", test_model, []),
            ("CS336 medium (24 layers, hidden 1024), batch 4 x 128", TRAIN, ["--size", "medium"]),
            ("TinyLlama-1.1B's shape (22 layers, hidden 2048), batch 4 x 128", TRAIN, ["--size", "1.1b"])]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs visible, affinity {sorted(os.sched_getaffinity(0))}")
    print("| job | allocations per step | capture time per step (median of 3) | peak |")
    print("|---|---|---|---|")
    for name, script, args in jobs:
        timed(script, args, 1)  # warm-up
        per_step, allocations = [], 0
        for _ in range(3):
            one, _ = timed(script, args, 1)
            four, result = timed(script, args, 4)
            per_step.append((four - one) / 3)
            allocations = result.allocations
        _, one_result = timed(script, args, 1)
        per = (allocations - one_result.allocations) // 3
        print(f"| {name} | {per:,} | {statistics.median(per_step):.2f} s | {result.peak_bytes / 2**30:.2f} GiB |")
    os.unlink(test_model)


if __name__ == "__main__":
    main()
