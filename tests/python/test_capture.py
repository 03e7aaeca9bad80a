#!/usr/bin/env python3
"""tests/python/test_capture.py: tensorpool.capture (python/tensorpool/capture.py) against PyTorch.

- The captured forward pass (fake CPU tensors, CUDA's autocast rules applied by the capture)
  equals, allocation by allocation and free by free, the same forward pass on fake CUDA tensors
  under PyTorch's own CUDA autocast (its C++ kernels, forced on: a machine without a GPU turns
  torch.autocast("cuda") off).
- The peak of two captured training steps (autocast bf16, AdamW) within 3% of the peak of the
  trace `tensorpool generate` writes for the same model (tests/python/loop_model.py).
- A step that synchronizes, empties the cache and reads its loss is captured; an op whose output
  size depends on values stops it with an error naming the op and the line; streams and frames
  are kept; the command line writes a .tptrace the CLI reads, and refuses bad arguments.

    tests/python/test_capture.py TENSORPOOL_CLI

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
import warnings
import weakref

CLI = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/tools/tensorpool")
HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")

from torch_here import torch  # noqa: E402 (runs the test where torch is, or skips it)
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, PACKAGE)
os.environ["TENSORPOOL_CLI"] = CLI
from tensorpool import capture  # noqa: E402
from loop_model import LoopModel  # noqa: E402

BASE = {"layers": 2, "hidden": 256, "heads": 8, "kv_heads": 8, "ffn": 512, "vocab": 1000,
        "micro_batch": 2, "seq": 128, "context": 128}
LLAMA = {"mlp": "gated", "norm": "rmsnorm", "biases": "false", "tied_embeddings": "false", "positions": 0}
GPT2 = {"mlp": "gelu", "norm": "layernorm", "biases": "true", "tied_embeddings": "true", "positions": 128,
        "dropout": "false", "qkv": "fused"}


def script_file(work, name, text):
    """Writes `text` as the script `name` in directory `work`; returns its path."""
    path = os.path.join(work, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def peak_of(events):
    """The most bytes live at once, from alloc and free_requested events."""
    live, now, peak = {}, 0, 0
    for e in events:
        if e.get("op") == "alloc":
            live[e["addr"]] = e["size"]
            now += e["size"]
            peak = max(peak, now)
        elif e.get("op") == "free_requested":
            now -= live.pop(e["addr"])
    return peak


def generated_peak(keys, steps=2):
    opts = ",".join(f"{k}:{v}" for k, v in dict(keys, steps=steps).items())
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "g.jsonl")
        subprocess.run([CLI, "generate", out, "--model", "custom", "--options", opts], check=True, capture_output=True)
        return peak_of(read_jsonl(out))


class CudaStorages(torch.utils._python_dispatch.TorchDispatchMode):
    """The reference: every new storage an op makes on (fake) CUDA, and when it dies, as
    ("alloc", size) and ("free", index of its alloc). Written apart from the capture's own."""

    def __init__(self):
        super().__init__()
        self.events, self.seen = [], {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                s = t.untyped_storage()
                if id(s) not in self.seen and s.nbytes() > 0:
                    index = len([e for e in self.events if e[0] == "alloc"])
                    self.seen[id(s)] = weakref.ref(s, lambda _, i=index, k=id(s): self._died(i, k))
                    self.events.append(("alloc", s.nbytes()))
        return out

    def _died(self, index, key):
        self.seen.pop(key, None)
        self.events.append(("free", index))


def forward(keys, mark):
    """The forward pass and loss under autocast; mark() is called right after the loss, inside
    the autocast region (the teardown that follows differs between the two harnesses)."""
    torch.manual_seed(0)
    model = LoopModel(keys, device="cuda")
    ids = torch.randint(0, keys["vocab"], (keys["micro_batch"], keys["seq"]), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model.forward(ids)
        loss = model.loss(logits, ids)
        mark()
    return model, logits, loss


def fake_cuda_forward(keys):
    """The events on fake CUDA tensors under PyTorch's own CUDA autocast kernels, forced on
    (torch.autocast("cuda") turns itself off without a GPU)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    ref = CudaStorages()
    events = []
    with FakeTensorMode(), ref:
        before = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))

        class CudaAutocast:
            def __init__(self, device_type, dtype):
                self.dtype = dtype

            def __enter__(self):
                torch.set_autocast_enabled("cuda", True)
                torch.set_autocast_dtype("cuda", self.dtype)
                torch.autocast_increment_nesting()

            def __exit__(self, *exc):
                torch.autocast_decrement_nesting()
                torch.clear_autocast_cache()
                torch.set_autocast_enabled("cuda", before[0])
                torch.set_autocast_dtype("cuda", before[1])

        saved, torch.autocast = torch.autocast, CudaAutocast
        try:
            forward(keys, lambda: events.extend(ref.events))
        finally:
            torch.autocast = saved
    return events


def captured_forward(keys):
    result = capture.run(lambda: forward(keys, torch.cuda.synchronize))  # stream_sync: where it stops
    index, events = {}, []
    for op, addr, size, _, _ in result.events:
        if op == "stream_sync":
            break
        if op == "alloc":
            index[addr] = len(index)
            events.append(("alloc", size))
        elif op == "free_requested":
            events.append(("free", index[addr]))
    return events


class ForwardAgainstFakeCuda(unittest.TestCase):
    def test_allocation_by_allocation(self):
        # Written-out attention and loss: on fake CUDA without a GPU, sdpa takes its math path
        # (no flash kernel to choose), so the reference would not be what a GPU does.
        cases = {"llama-eager": dict(BASE, **LLAMA, attention="eager", loss="written", activation="written"),
                 "llama-eager-library": dict(BASE, **LLAMA, attention="eager", loss="cross_entropy"),
                 "gpt2-eager": dict(BASE, **GPT2, attention="eager")}
        for name, keys in cases.items():
            with self.subTest(case=name):
                want = fake_cuda_forward(keys)
                got = captured_forward(keys)
                allocs = sum(1 for e in want if e[0] == "alloc")
                print(f"{name}: {allocs} allocations and {len(want) - allocs} frees on fake CUDA; "
                      f"the capture {'the same' if got == want else 'differs'}")
                self.assertGreater(allocs, 50)
                first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                self.assertEqual(got, want, f"{name}: first difference at event {first}: "
                                 f"{got[first:first + 3]} against {want[first:first + 3]}")

    def test_policies_op_by_op(self):
        # The dtype each op returns under autocast bf16, from 16-bit and 32-bit inputs: the
        # capture's kernels against PyTorch's own CUDA autocast on fake CUDA, one policy of each
        # kind and the overloads this torch registers beyond the published lists (rms_norm,
        # linalg_matrix_sqrth).
        calls = {
            "mm": lambda a, b: a @ b, "bmm": lambda a, b: torch.bmm(a[None], b[None]),
            "linear": lambda a, b: F.linear(a, b), "exp": lambda a, b: torch.exp(a),
            "pow": lambda a, b: a.pow(2), "rsqrt": lambda a, b: torch.rsqrt(a),
            "rms_norm": lambda a, b: torch.rms_norm(a, [a.shape[-1]]),
            "layer_norm": lambda a, b: F.layer_norm(a, [a.shape[-1]]),
            "softmax": lambda a, b: torch.softmax(a, -1), "log_softmax": lambda a, b: torch.log_softmax(a, -1),
            "sum": lambda a, b: a.sum(), "sum.dim": lambda a, b: a.sum(-1), "cumsum": lambda a, b: a.cumsum(0),
            "norm": lambda a, b: a.norm(), "linalg_vector_norm": lambda a, b: torch.linalg.vector_norm(a),
            "logsumexp": lambda a, b: torch.logsumexp(a, -1), "addcmul": lambda a, b: torch.addcmul(a, a, b),
            "cross_entropy": lambda a, b: F.cross_entropy(a, torch.zeros(a.shape[0], dtype=torch.long, device=a.device)),
            "linalg_matrix_sqrth": lambda a, b: torch.linalg.matrix_sqrth(a),
            "mul": lambda a, b: a * b, "relu": lambda a, b: torch.relu(a),
        }
        combos = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]

        def dtypes(make):
            out = {}
            for name, call in calls.items():
                for da, db in combos:
                    a, b = make(da), make(db)
                    out[(name, da, db)] = call(a, b).dtype
            return out

        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            torch.set_autocast_enabled("cuda", True)
            torch.set_autocast_dtype("cuda", torch.bfloat16)
            try:
                want = dtypes(lambda dt: torch.randn(8, 8, device="cuda", dtype=dt))
            finally:
                torch.set_autocast_enabled("cuda", False)
                torch.clear_autocast_cache()
        got = {}

        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                got.update(dtypes(lambda dt: torch.randn(8, 8, device="cuda", dtype=dt)))
        capture.run(run)
        differ = {k: (got[k], v) for k, v in want.items() if got[k] != v}
        self.assertEqual(differ, {})
        self.assertEqual(want[("mm", torch.float32, torch.float32)], torch.bfloat16)  # the check can fail
        self.assertEqual(want[("exp", torch.bfloat16, torch.bfloat16)], torch.float32)

    def test_autocast_lists_cover_this_torch(self):
        unknown, _ = capture.autocast_coverage()
        self.assertEqual(unknown, [], "CUDA autocast casts ops the capture has no rule for")


def training(keys, steps_in_loop=3, sync=False):
    def main():
        torch.manual_seed(0)
        model = LoopModel(keys, device="cuda")
        opt = torch.optim.AdamW(model.params, lr=1e-3)
        for _ in range(steps_in_loop):
            ids = torch.randint(0, keys["vocab"], (keys["micro_batch"], keys["seq"]), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model.forward(ids)
                loss = model.loss(logits, ids)
            loss.backward()
            if sync:
                torch.cuda.synchronize()
                print(f"loss {loss.item():.3f}")
            opt.step()
            opt.zero_grad(set_to_none=True)
            if sync:
                torch.cuda.empty_cache()
    return main


class PeakAgainstGenerator(unittest.TestCase):
    def test_two_training_steps(self):
        cases = {"llama-sdpa": dict(BASE, **LLAMA, attention="sdpa", loss="cross_entropy", activation="fused"),
                 "gpt2-sdpa": dict(BASE, **GPT2, attention="sdpa"),
                 "llama-eager-written": dict(BASE, **LLAMA, attention="eager", loss="written", activation="written")}
        for name, keys in cases.items():
            with self.subTest(case=name):
                result = capture.run(training(keys), steps=2)
                self.assertEqual(result.steps, 2)
                want = generated_peak(keys)
                error = result.peak_bytes / want - 1.0
                print(f"{name}: captured peak {result.peak_bytes:,} bytes, generated {want:,} ({100 * error:+.2f}%)")
                self.assertLessEqual(abs(error), 0.03)


class Kinds(unittest.TestCase):
    def test_model_states_after_the_first_step(self):
        # After the first optimizer step (the capture stops there, before zero_grad): the
        # parameters, one gradient each and AdamW's two moments each are live, and labelled so.
        keys = dict(BASE, **LLAMA, attention="sdpa", loss="cross_entropy")
        result = capture.run(training(keys), steps=1)
        live = {}
        for op, addr, size, _, label in result.events:
            if op == "alloc":
                live[addr] = (size, label.split(":", 1)[0])
            elif op == "free_requested":
                del live[addr]
        by_kind = {}
        for size, kind in live.values():
            by_kind[kind] = by_kind.get(kind, 0) + size
        params = sum(t.numel() * 4 for t in LoopModel(keys).params)
        print(f"live after step 1 by kind: {by_kind}; parameters {params:,} bytes")
        self.assertEqual(by_kind.get("weights"), params)
        self.assertEqual(by_kind.get("grads"), params)
        self.assertEqual(by_kind.get("optimizer"), 2 * params)


class StepsThatTouchTheDevice(unittest.TestCase):
    def test_synchronize_empty_cache_and_item(self):
        keys = dict(BASE, **LLAMA, attention="sdpa", loss="cross_entropy")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = capture.run(training(keys, sync=True), steps=2)
        ops = [e[0] for e in result.events]
        self.assertEqual(ops.count("stream_sync"), 2)
        self.assertEqual(ops.count("empty_cache"), 1)  # the capture stops in the second step()
        self.assertEqual(ops.count("iteration"), 2)
        said = [str(w.message) for w in caught if "tensorpool.capture" in str(w.message)]
        self.assertEqual(len(said), 1, said)  # once per line
        self.assertIn(".item()", said[0])
        self.assertIn("test_capture.py:", said[0])

    def test_a_value_dependent_size_names_the_op_and_line(self):
        def main():
            x = torch.randn(64, device="cuda")
            return torch.nonzero(x)  # the line the error names
        line = main.__code__.co_firstlineno + 2
        with self.assertRaises(capture.CaptureError) as e:
            capture.run(main)
        self.assertIn("nonzero", str(e.exception))
        self.assertIn(f"test_capture.py:{line}", str(e.exception))

    def test_streams_record_stream_and_frames(self):
        def main():
            side = torch.cuda.Stream()
            a = torch.empty(1000, device="cuda")
            with torch.cuda.stream(side):
                b = torch.empty(2000, device="cuda")
                assert torch.cuda.current_stream() == side
            a.record_stream(side)
            c = a.cpu()  # a host copy: not a device allocation
            return a, b, c
        result = capture.run(main)
        allocs = [e for e in result.events if e[0] == "alloc"]
        self.assertEqual([(e[2], e[3] != 0) for e in allocs], [(4000, False), (8000, True)])
        self.assertTrue(all("main (" in e[4] and "test_capture.py:" in e[4] for e in allocs))
        recorded = [e for e in result.events if e[0] == "record_stream"]
        self.assertEqual([(e[1], e[3]) for e in recorded], [(allocs[0][1], allocs[1][3])])

    def test_a_program_that_raises(self):
        def main():
            torch.empty(10, device="cuda")
            raise KeyError("batch")
        with self.assertRaises(capture.ScriptError) as e:
            capture.run(main, out=os.path.join(tempfile.gettempdir(), "never-written.jsonl"))
        self.assertIsInstance(e.exception.error, KeyError)
        self.assertIn("raised KeyError", str(e.exception))
        self.assertIn(f"test_capture.py:{main.__code__.co_firstlineno + 2}", str(e.exception))
        self.assertFalse(os.path.exists(os.path.join(tempfile.gettempdir(), "never-written.jsonl")))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            capture.run(lambda: torch.empty(10, device="cuda"), steps=3)
        self.assertTrue(any("ended after 0 optimizer steps of the 3" in str(w.message) for w in caught))

    def test_default_devices(self):
        def main():
            with torch.device("cuda"):
                a = torch.zeros(1000)                     # 4000 bytes
                layer = torch.nn.Linear(8, 8)             # 256 + 32
            torch.set_default_device("cuda")
            try:
                b = torch.ones(10)                        # 40
            finally:
                torch.set_default_device(None)
            return a, layer, b, torch.zeros(3)            # the last on the host: not recorded
        result = capture.run(main)
        self.assertEqual([e[2] for e in result.events if e[0] == "alloc"], [4000, 256, 32, 40])

    def test_data_loader_workers_load_here(self):
        from torch.utils.data import DataLoader, TensorDataset

        def main():
            data = TensorDataset(torch.randint(0, 100, (64, 16)))
            loader = DataLoader(data, 8, True, None, None, 2, pin_memory=True, prefetch_factor=4,
                                persistent_workers=True)  # num_workers by position
            for (x,) in loader:
                x.to("cuda", non_blocking=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = capture.run(main)
        self.assertEqual([e[2] for e in result.events if e[0] == "alloc"], [8 * 16 * 8] * 8)
        self.assertTrue(any("DataLoader loads in this process" in str(w.message) for w in caught))

    def test_state_is_restored(self):
        capture.run(lambda: torch.empty(10, device="cuda"))
        self.assertFalse(torch.cuda.is_available())  # this machine has no GPU
        self.assertIs(torch.autocast, torch.amp.autocast_mode.autocast)
        self.assertEqual(torch.empty(3).device.type, "cpu")


SCRIPT = '''
import sys
import torch
sys.path.insert(0, {here!r})
from loop_model import LoopModel
keys = {keys!r}
keys["micro_batch"] = int(sys.argv[1])
model = LoopModel(keys, device="cuda")
opt = torch.optim.AdamW(model.params)
for _ in range(100):
    ids = torch.randint(0, keys["vocab"], (keys["micro_batch"], keys["seq"]), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model.loss(model.forward(ids), ids)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''


MODULE_SCRIPT = '''
# A training script as people write them (nanoGPT's shape): nn.Modules, tied embeddings,
# activation checkpointing, sdpa with dropout, fp16 autocast with a GradScaler, fused AdamW,
# gradient accumulation, clipping, a batch from numpy through pinned memory.
import sys
import numpy as np
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.attn, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc, self.out = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.attn(self.ln1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
        x = x + self.drop(self.proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))

class GPT(nn.Module):
    def __init__(self, V=1024, d=128, L=2, h=4, T=64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(L))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, V, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

data = np.random.randint(0, 1024, size=10000).astype(np.uint16)
model = GPT().to("cuda")
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
scaler = torch.amp.GradScaler("cuda")
for it in range(10):
    for micro in range(2):
        ix = torch.randint(len(data) - 65, (4,))
        x = torch.stack([torch.from_numpy(data[i:i + 64].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 65].astype(np.int64)) for i in ix])
        x, y = x.pin_memory().to("cuda", non_blocking=True), y.pin_memory().to("cuda", non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss = model(x, y) / 2
        scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
'''


class ModuleScript(unittest.TestCase):
    def test_a_script_as_people_write_them(self):
        with tempfile.TemporaryDirectory() as work:
            script = script_file(work, "train.py", MODULE_SCRIPT)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = capture.run_script(script, steps=1)
        self.assertEqual(result.steps, 1)
        live = {}
        for op, addr, size, _, label in result.events:
            if op == "alloc":
                live[addr] = (size, label.split(":", 1)[0], label)
            elif op == "free_requested":
                del live[addr]
        by_kind = {}
        for size, kind, _ in live.values():
            by_kind[kind] = by_kind.get(kind, 0) + size
        d, V, T, L = 128, 1024, 64, 2
        block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        params = V * d + T * d + L * block + 2 * d  # the head is the token embedding (tied): once
        tensors = 2 + L * 12 + 2
        print(f"live after the first step by kind: {by_kind}; {params:,} parameters in {tensors} tensors")
        self.assertEqual(by_kind.get("weights"), 4 * params)
        self.assertEqual(by_kind.get("grads"), 4 * params)
        # fused AdamW: both moments and a step count on the device per parameter tensor
        self.assertEqual(by_kind.get("optimizer"), 2 * 4 * params + 4 * tensors)
        self.assertTrue(any("train.py:" in label for _, _, label in live.values()))


class CommandLine(unittest.TestCase):
    def run_capture(self, *args):
        env = dict(os.environ, PYTHONPATH=PACKAGE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        return subprocess.run([sys.executable, "-m", "tensorpool.capture", *args], capture_output=True, text=True, env=env)

    def test_script_to_tptrace(self):
        keys = dict(BASE, **LLAMA, attention="sdpa", loss="cross_entropy")
        with tempfile.TemporaryDirectory() as work:
            script = script_file(work, "train.py", SCRIPT.format(here=HERE, keys=keys))
            out = os.path.join(work, "job.tptrace")
            done = self.run_capture("--out", out, "--steps", "2", script, "2")
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn("2 optimizer steps", done.stderr)
            info = subprocess.run([CLI, "info", out, "--json"], capture_output=True, text=True)
            self.assertEqual(info.returncode, 0, info.stderr)
            self.assertIn("train.py", info.stdout)
            fit = subprocess.run([CLI, "fit", out, "--json"], capture_output=True, text=True)
            self.assertEqual(fit.returncode, 0, fit.stderr)
            self.assertEqual(sorted(os.listdir(work)), ["job.tptrace", "train.py"])  # no temporaries left

    def test_plan_on_the_captured_script(self):
        keys = dict(BASE, **LLAMA, attention="sdpa", loss="cross_entropy")
        env = dict(os.environ, PYTHONPATH=PACKAGE + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with tempfile.TemporaryDirectory() as work:
            script = script_file(work, "train.py", SCRIPT.format(here=HERE, keys=keys))
            # The peak of each micro-batch, captured here; a capacity between those of 2 and 4.
            peaks = {mb: capture.run_script(script, [str(mb)], steps=2).peak_bytes for mb in (1, 2, 4)}
            capacity = (peaks[2] + peaks[4]) // 2
            plan = subprocess.run([CLI, "plan", "--capture", f"{script} {{micro_batch}}", "--python", sys.executable,
                                   "--global-batch", "8", "--capacity", str(capacity), "--allocators", "raw,pytorch",
                                   "--json", "-q"], capture_output=True, text=True, env=env)
            self.assertEqual(plan.returncode, 0, plan.stderr)
            out = json.loads(plan.stdout)
            self.assertEqual(out["capture"], f"{script} {{micro_batch}}")
            self.assertEqual(out["changes"], [])
            raw = next(a for a in out["allocators"] if a["allocator"] == "raw")
            print(f"plan --capture at {capacity:,} bytes: raw fits micro-batch {raw['micro_batch']}, peak "
                  f"{raw['peak_requested_bytes']:,}; captured peaks {peaks}")
            self.assertEqual(raw["micro_batch"], 2)
            self.assertEqual(raw["peak_requested_bytes"], peaks[2])
            self.assertEqual(raw["next_micro_batch"], 4)
            self.assertIn("micro-batch 2", out["answer"]["text"])
            self.assertGreater(out["answer"]["breakdown"]["bytes"]["weights"], 0)

            refused = subprocess.run([CLI, "plan", "--capture", script, "--global-batch", "8"], capture_output=True, text=True)
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("{micro_batch}", refused.stderr)
            model = subprocess.run([CLI, "plan", "--capture", f"{script} {{micro_batch}}", "--model", "gpt2",
                                    "--global-batch", "8"], capture_output=True, text=True)
            self.assertNotEqual(model.returncode, 0)
            self.assertIn("--model does not apply", model.stderr)
            broken = script_file(work, "broken.py", "raise RuntimeError('no data here')\n")
            failing = subprocess.run([CLI, "plan", "--capture", f"{broken} {{micro_batch}}", "--python", sys.executable,
                                      "--global-batch", "8", "-q"], capture_output=True, text=True, env=env)
            self.assertNotEqual(failing.returncode, 0)
            self.assertIn("capturing micro-batch", failing.stderr)
            self.assertIn("no data here", failing.stderr)

    def test_bad_arguments(self):
        with tempfile.TemporaryDirectory() as work:
            missing = self.run_capture("--out", os.path.join(work, "x.tptrace"), os.path.join(work, "nope.py"))
            self.assertEqual(missing.returncode, 1)
            self.assertIn("nope.py: no such script", missing.stderr)
            script = script_file(work, "s.py", "raise SystemExit(3)\n")
            failed = self.run_capture("--out", os.path.join(work, "x.tptrace"), script)
            self.assertEqual(failed.returncode, 1)
            self.assertIn("exited with status 3", failed.stderr)
            raising = script_file(work, "r.py",
                                  "import torch\nx = torch.zeros(4, device='cuda')\nraise ValueError('no data here')\n")
            raised = self.run_capture("--out", os.path.join(work, "x.tptrace"), raising)
            self.assertEqual(raised.returncode, 1)
            self.assertIn("r.py raised ValueError: no data here at " + raising + ":3; no trace written", raised.stderr)
            self.assertIn("Traceback", raised.stderr)
            idle = script_file(work, "idle.py", "import torch\nx = torch.zeros(4, device='cuda')\n")
            never = self.run_capture("--out", os.path.join(work, "idle.jsonl"), idle)
            self.assertEqual(never.returncode, 0, never.stderr)  # still a trace: a forward-only script
            self.assertIn("ended after 0 optimizer steps of the 2 asked for", never.stderr)
            os.unlink(os.path.join(work, "idle.jsonl"))
            named = self.run_capture("--out", os.path.join(work, "x.txt"), script)
            self.assertNotEqual(named.returncode, 0)
            capacity = self.run_capture("--out", os.path.join(work, "x.jsonl"), "--capacity", "lots", script)
            self.assertEqual(capacity.returncode, 1)
            self.assertIn("--capacity 'lots'", capacity.stderr)
            self.assertEqual(sorted(os.listdir(work)), ["idle.py", "r.py", "s.py"])  # nothing else written


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
