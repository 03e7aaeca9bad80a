#!/usr/bin/env python3
"""tests/python/test_tensorpool_module.py: the ctypes module (python/tensorpool) without a GPU.

CTest runs it against libtensorpool_torch_double.so (the PyTorch library on the CUDA-runtime test
double; TENSORPOOL_TEST_BACKEND=async) or, in builds without CUDA, libtensorpool_c.so on the
simulated backend. The allocations are made through the library as PyTorch would make them
(tensorpool_torch_malloc / _free) or, without those, through the C API.

Where torch is importable (or, failing that, torch/cuda/_memory_viz.py of an installed torch can
be loaded on its own: it needs only the standard library), torch.cuda._memory_viz must render
the exported snapshot; without torch those tests are skipped. TENSORPOOL_CLI, when set, is the
tensorpool binary whose importer must read the snapshot back to the same figures, and which
the module's analyses (tensorpool.compare/fit/info/report, python -m tensorpool) run: their
answers and errors must be the CLI's own.
"""
import ctypes
import importlib.util
import json
import os
import pickle
import pickletools
import subprocess
import sys
import tempfile
import unittest

import tensorpool
from replay_json import without_timings

BACKEND = os.environ.get("TENSORPOOL_TEST_BACKEND", "simulated")
MiB = 1 << 20
GiB = 1 << 30

# The opcodes the JavaScript unpickler of pytorch.org/memory_viz understands (MemoryViz.js).
VIEWER_OPCODES = {
    "PROTO", "FRAME", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "MARK", "SETITEMS", "SETITEM",
    "APPENDS", "APPEND", "DICT", "LIST", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BININT",
    "BININT1", "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "NONE",
    "NEWTRUE", "NEWFALSE", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "STOP",
}

STAT_NAMES = ["allocation", "segment", "active", "inactive_split", "allocated_bytes",
              "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes"]
EXPECTED_KEYS = {f"{s}.{pool}.{m}" for s in STAT_NAMES for pool in ("all", "small_pool", "large_pool")
                 for m in ("current", "peak", "allocated", "freed")}
EXPECTED_KEYS |= {f"{s}.{m}" for s in ("oversize_allocations", "oversize_segments")
                  for m in ("current", "peak", "allocated", "freed")}
EXPECTED_KEYS |= {"num_alloc_retries", "num_ooms", "max_split_size", "num_sync_all_streams",
                  "num_device_alloc", "num_device_free", "num_steps_found", "num_planned_epochs",
                  "num_mirrored_steps", "num_predicted_steps", "num_plans_on_caller", "num_stitches"}


class NoGlobals(pickle.Unpickler):
    """Refuses every global: only plain data loads."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def cli(*args):
    """The tensorpool CLI's output (a program of its own: without the sanitizer runtime this
    interpreter preloads, which an executable of a clang sanitizer build links itself)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([os.environ["TENSORPOOL_CLI"], *args], capture_output=True, text=True,
                          check=True, env=env).stdout


def load_plain(path):
    with open(path, "rb") as f:
        return NoGlobals(f).load()


def memory_viz():
    """torch.cuda._memory_viz, or that file of an installed torch loaded alone, or None."""
    try:
        from torch.cuda import _memory_viz
        return _memory_viz
    except Exception:
        pass
    try:
        spec = importlib.util.find_spec("torch")
    except Exception:
        spec = None
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "cuda", "_memory_viz.py")
    if not os.path.exists(path):
        return None
    module_spec = importlib.util.spec_from_file_location("tensorpool_test_memory_viz", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


class Workload:
    """Allocations on device 0, through the PyTorch entry points when the library has them."""

    def __init__(self):
        self.lib = tensorpool._library()
        self.torch_abi = hasattr(self.lib, "tensorpool_torch_malloc")
        if self.torch_abi:
            self.lib.tensorpool_torch_malloc.restype = ctypes.c_void_p
            self.lib.tensorpool_torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            self.lib.tensorpool_torch_free.restype = None
            self.lib.tensorpool_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                                       ctypes.c_void_p]
        self.live = {}

    def alloc(self, size):
        if self.torch_abi:
            p = self.lib.tensorpool_torch_malloc(size, 0, None)
        else:
            out = ctypes.c_void_p()
            status = self.lib.tensorpool_alloc(tensorpool._handle(0), size, 0, ctypes.byref(out))
            p = out.value if status == 0 else None
        if p:
            self.live[p] = size
        return p

    def free(self, p):
        size = self.live.pop(p)
        if self.torch_abi:
            self.lib.tensorpool_torch_free(p, size, 0, None)
        else:
            tensorpool._check(self.lib.tensorpool_free(tensorpool._handle(0), ctypes.c_void_p(p)), "free")

    def free_all(self):
        for p in list(self.live):
            self.free(p)


def setUpModule(settings=None):
    lib = tensorpool._library()
    if hasattr(lib, "tensorpool_testing_reset"):  # the double: stream work completes at once
        lib.tensorpool_testing_reset.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
        lib.tensorpool_testing_reset(1, 16 * GiB, 1)
    tensorpool.configure(f"backend:{BACKEND}" + (f",{settings}" if settings else ""))
    tensorpool.record_history(True, 100000)


def run_python(code, **env):
    full = dict(os.environ)
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          timeout=120)


class StatsTest(unittest.TestCase):
    def setUp(self):
        self.w = Workload()

    def tearDown(self):
        self.w.free_all()

    def test_keys_are_pytorchs(self):
        self.w.alloc(MiB)
        stats = tensorpool.memory_stats(0)
        self.assertEqual(set(stats), EXPECTED_KEYS)
        self.assertEqual(list(stats), sorted(stats))
        self.assertTrue(all(isinstance(v, int) for v in stats.values()))
        self.assertEqual(tensorpool.memory_stats_as_nested_dict(0)["allocated_bytes"]["all"]["current"],
                         stats["allocated_bytes.all.current"])
        self.assertEqual(tensorpool.memory_stats(5), {})  # no allocator on device 5 yet

    def test_figures_follow_the_workload(self):
        before = tensorpool.memory_stats(0) if tensorpool._existing(0) else {}
        sizes = [512, 4096, 3 * MiB + 7, 25 * MiB, 300 * MiB]
        for s in sizes:
            self.assertIsNotNone(self.w.alloc(s))
        stats = tensorpool.memory_stats(0)
        base = lambda k: before.get(k, 0)
        self.assertEqual(stats["requested_bytes.all.current"] - base("requested_bytes.all.current"), sum(sizes))
        self.assertEqual(stats["allocation.all.current"] - base("allocation.all.current"), len(sizes))
        self.assertGreaterEqual(stats["allocated_bytes.all.current"], stats["requested_bytes.all.current"])
        self.assertGreaterEqual(stats["reserved_bytes.all.current"], stats["allocated_bytes.all.current"])
        self.assertEqual(stats["allocation.small_pool.current"] + stats["allocation.large_pool.current"],
                         stats["allocation.all.current"])
        self.assertEqual(tensorpool.memory_allocated(0), stats["allocated_bytes.all.current"])
        self.assertGreaterEqual(tensorpool.max_memory_reserved(0), tensorpool.memory_reserved(0))
        ooms = stats["num_ooms"]
        self.assertIsNone(self.w.alloc(1 << 44))  # 16 TiB: more than any device here
        self.assertEqual(tensorpool.memory_stats(0)["num_ooms"], ooms + 1)
        self.w.free_all()
        self.assertEqual(tensorpool.memory_stats(0)["requested_bytes.all.current"],
                         base("requested_bytes.all.current"))

    def test_empty_cache_returns_free_segments(self):
        p = self.w.alloc(40 * MiB)
        self.w.free(p)
        self.assertGreater(tensorpool.memory_reserved(0), 0)
        tensorpool.empty_cache()
        self.assertEqual(tensorpool.memory_reserved(0), 0)
        self.assertEqual(tensorpool.memory_stats(0)["segment.all.current"], 0)

    def test_steps_settle_with_no_new_memory(self):
        # Steps around a block that stays, each ended by tensorpool.step(): once planned (which
        # the C++ and C tests check place by place) they reserve nothing more from step to step.
        weights = self.w.alloc(64 * MiB)
        reserved = []
        # The planner is a thread here (the default): a plan is followed a step or more after the
        # step it plans, and its pages above the plan go a step or more after that, later on a
        # loaded machine. So the steps run until three in a row reserve the same, at most 64.
        while len(reserved) < 64 and (len(reserved) < 8 or len(set(reserved[-3:])) != 1):
            a = self.w.alloc(40 * MiB)
            b = self.w.alloc(40 * MiB)
            self.w.free(a)
            c = self.w.alloc(60 * MiB)
            self.w.free(b)
            self.w.free(c)
            tensorpool.step()
            reserved.append(tensorpool.memory_reserved(0))
        self.assertEqual(len(set(reserved[-3:])), 1, reserved)
        self.assertGreaterEqual(reserved[-1], (64 + 100) * MiB)
        self.w.free(weights)
        tensorpool.step()

    def test_optimizer_steps_mark_the_steps(self):
        # Steps around a block that stays, ended by optimizer.step() alone once
        # step_after_optimizer() is installed. Run where torch is (another interpreter, with this
        # module's Workload), in the virtual-memory mode (the double's vmm backend), planning in
        # the free that ends a step (vmm_planner:synchronous: which step first follows the plan
        # does not then depend on a thread's timing). Online, c (60 MiB) does not go where a (40)
        # was; once the steps are planned around the weights, it does: from the third step on (the
        # second remaps idle pages, vmm_idle_divisor's default, and its step() maps the hole that
        # left under the plan with the pages above it, the stream's work being done; as in the
        # C++ test of docs/vmm.md, "Steps"). Without the hook nothing marks a step.
        python = torch_python()
        if python is None:
            self.skipTest("no interpreter with torch (scripts/install-deps.sh torch)")
        if "asan" in os.environ.get("LD_PRELOAD", ""):
            self.skipTest("not under the sanitizer: torch's own libraries would run with its runtime preloaded")
        code = (
            "import json, sys\n"
            f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
            "import torch, tensorpool, test_tensorpool_module as t\n"
            "t.setUpModule('vmm_planner:synchronous')\n"
            "w = t.Workload()\n"
            "param = torch.nn.Parameter(torch.zeros(4))\n"
            "opt = torch.optim.SGD([param], lr=0.1)\n"
            "handle = tensorpool.step_after_optimizer() if sys.argv[1] == 'hook' else None\n"
            "weights = w.alloc(64 * t.MiB)\n"
            "c_at_a = []\n"
            "for _ in range(6):\n"
            "    a = w.alloc(40 * t.MiB); b = w.alloc(40 * t.MiB); w.free(a)\n"
            "    c = w.alloc(60 * t.MiB); w.free(b); w.free(c)\n"
            "    c_at_a.append(c == a)\n"
            "    param.grad = torch.ones(4)\n"
            "    opt.step()\n"
            "if handle is not None:\n"
            "    handle.remove()\n"
            "w.free(weights)\n"
            "print(json.dumps(c_at_a))\n")
        env = dict(os.environ, TENSORPOOL_TEST_BACKEND="vmm" if BACKEND == "async" else BACKEND)
        runs = {}
        for mode in ("hook", "none"):
            r = subprocess.run([python, "-c", code, mode], env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr)
            runs[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(runs["hook"], [False, False, True, True, True, True], runs)
        self.assertEqual(runs["none"], [False] * 6, runs)

    def test_step_after_optimizer_needs_torch(self):
        if torch_importable():
            self.skipTest("torch is importable: test_optimizer_steps_mark_the_steps covers it")
        with self.assertRaisesRegex(tensorpool.TensorpoolError, r"step_after_optimizer\(\) needs PyTorch"):
            tensorpool.step_after_optimizer()

    def test_memory_fraction_caps_reserved_memory(self):
        tensorpool.set_memory_fraction(0.001, 0)
        try:
            self.assertIsNone(self.w.alloc(2 * GiB))
        finally:
            tensorpool.set_memory_fraction(1.0, 0)
        self.assertIsNotNone(self.w.alloc(2 * GiB))

    def test_memory_summary(self):
        self.w.alloc(5 * MiB)
        summary = tensorpool.memory_summary(0)
        self.assertIn("tensorpool memory summary, device 0", summary)
        self.assertIn("reserved memory", summary)
        self.assertIn("large pool", summary)
        self.assertIn("5.00 MiB", summary)
        self.assertNotIn("large pool", tensorpool.memory_summary(0, abbreviated=True))

    def test_reset_peak_memory_stats(self):
        p = self.w.alloc(64 * MiB)
        self.w.free(p)
        tensorpool.reset_peak_memory_stats(0)
        self.assertEqual(tensorpool.max_memory_allocated(0), tensorpool.memory_allocated(0))

    def test_record_stream_finds_the_pointer(self):
        p = self.w.alloc(MiB)
        tensorpool.record_stream(p, 0)
        with self.assertRaises(tensorpool.TensorpoolError):
            tensorpool.record_stream(12345, 0)


class SnapshotTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        w = Workload()
        blocks = [w.alloc(s) for s in (100, 700 * 1024, 2 * MiB + 1, 30 * MiB, 70 * MiB, 5 * MiB)]
        for p in blocks[::2]:
            w.free(p)
        w.alloc(1 << 44)  # an OOM, recorded with device_free
        cls.workload = w
        cls.dir = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.dir.name, "snapshot.pickle")
        tensorpool.dump_snapshot(cls.path)
        cls.stats = tensorpool.memory_stats(0)
        cls.data = load_plain(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.workload.free_all()
        cls.dir.cleanup()

    def test_plain_data_the_viewer_can_read(self):
        with open(self.path, "rb") as f:
            raw = f.read()
        self.assertEqual(raw[:2], b"\x80\x04")
        used = {op.name for op, _, _ in pickletools.genops(raw)}
        self.assertLessEqual(used, VIEWER_OPCODES)

    def test_segments_tile_with_blocks(self):
        segments = self.data["segments"]
        self.assertGreater(len(segments), 0)
        reserved = allocated = 0
        for seg in segments:
            for key in ("device", "address", "total_size", "allocated_size", "active_size",
                        "requested_size", "stream", "segment_type", "is_expandable", "blocks"):
                self.assertIn(key, seg)
            self.assertIn(seg["segment_type"], ("small", "large"))
            addr = seg["address"]
            for b in seg["blocks"]:
                self.assertEqual(b["address"], addr)
                self.assertIn(b["state"], ("active_allocated", "active_pending_free", "inactive"))
                addr += b["size"]
                if b["state"] == "active_allocated":
                    allocated += b["size"]
                    self.assertLessEqual(b["requested_size"], b["size"])
            self.assertEqual(addr, seg["address"] + seg["total_size"])
            reserved += seg["total_size"]
        self.assertEqual(reserved, self.stats["reserved_bytes.all.current"])
        self.assertEqual(allocated, self.stats["allocated_bytes.all.current"])
        self.assertEqual([s["address"] for s in segments], sorted(s["address"] for s in segments))

    def test_device_traces(self):
        trace = self.data["device_traces"][0]
        actions = {e["action"] for e in trace}
        self.assertTrue({"alloc", "free_requested", "free_completed", "segment_alloc", "oom"} <= actions)
        for e in trace:
            self.assertIn("size", e)
            self.assertIn("stream", e)
            self.assertIn("time_us", e)
            self.assertEqual(e["frames"], [])
            if e["action"] == "oom":
                self.assertNotIn("addr", e)
                self.assertEqual(e["size"], 1 << 44)
                self.assertGreater(e["device_free"], 0)
            else:
                self.assertIn("addr", e)
        times = [e["time_us"] for e in trace]
        self.assertEqual(times, sorted(times))
        self.assertEqual(self.data["allocator_settings"]["allocator"], "tensorpool")
        self.assertEqual(self.data["allocator_settings"]["backend"], BACKEND)

    def test_history_walks_back_consistently(self):
        """The viewer rebuilds each earlier state by undoing events from the final segments: a
        free_requested needs its block live, a segment_alloc its segment, and every live block
        must lie in a segment at every step."""
        segments = {s["address"]: s["total_size"] for s in self.data["segments"]}
        blocks = {b["address"] for s in self.data["segments"] for b in s["blocks"]
                  if b["state"] in ("active_allocated", "active_pending_free")}
        for e in reversed(self.data["device_traces"][0]):
            action = e["action"]
            if action == "free_completed":
                blocks.add(e["addr"])
            elif action == "free_requested":
                self.assertIn(e["addr"], blocks)
            elif action == "alloc":
                blocks.discard(e["addr"])
            elif action == "segment_free":
                segments[e["addr"]] = e["size"]
            elif action == "segment_alloc":
                self.assertEqual(segments.pop(e["addr"]), e["size"])
            for b in blocks:
                self.assertTrue(any(a <= b < a + n for a, n in segments.items()), hex(b))

    @unittest.skipUnless(os.environ.get("TENSORPOOL_CLI"), "TENSORPOOL_CLI not set")
    def test_reimports_with_tensorpool_to_the_same_figures(self):
        out = cli("info", self.path, "--json")
        info = json.loads(out)
        live = requested = peak = 0
        for e in self.data["device_traces"][0]:  # the window covers the allocator's whole life
            if e["action"] == "alloc":
                live += 1
                requested += e["size"]
                peak = max(peak, requested)
            elif e["action"] == "free_requested":
                requested -= e["size"]
        self.assertTrue(info["recorded"]["present"])
        self.assertEqual(info["peak_requested_bytes"], peak)
        self.assertEqual(info["recorded"]["final_reserved_bytes"], self.stats["reserved_bytes.all.current"])
        self.assertEqual(info["recorded"]["peak_reserved_bytes"], self.stats["reserved_bytes.all.peak"])

    def test_memory_viz_renders_it(self):
        viz = memory_viz()
        if viz is None:
            self.skipTest("torch is not installed: torch.cuda._memory_viz not available")
        self.assertIn("base64", viz.trace_plot(self.data))
        self.assertIn("base64", viz.trace_plot(self.data, plot_segments=True))
        self.assertIn("base64", viz.segment_plot(self.data))
        self.assertIn("total_reserved", viz.segsum(self.data))  # asserts the blocks add up
        self.assertIn("raise OutOfMemoryError", viz.trace(self.data))

    def test_unwritable_path_is_refused(self):
        bad = os.path.join(self.dir.name, "missing", "x.pickle")
        with self.assertRaises(tensorpool.TensorpoolError) as caught:
            tensorpool.dump_snapshot(bad)
        self.assertIn("missing", str(caught.exception))
        self.assertEqual(caught.exception.status, "TENSORPOOL_ERROR_IO")
        self.assertFalse(os.path.exists(os.path.dirname(bad)))


class InstallTest(unittest.TestCase):
    def test_bad_tensorpool_conf_is_refused_naming_the_key(self):
        r = run_python("import tensorpool; tensorpool.install()",
                       TENSORPOOL_CONF=f"backend:{BACKEND},bogus_key:1")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("TensorpoolConfigError", r.stderr)
        self.assertIn("bogus_key", r.stderr)
        self.assertIn("TENSORPOOL_CONF", r.stderr)

    def test_bad_conf_argument_is_refused_naming_the_key(self):
        r = run_python("import tensorpool; tensorpool.install('max_split_size:lots')")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("'max_split_size'", r.stderr)

    def test_install_needs_torch(self):
        if torch_importable():
            self.skipTest("torch is importable: test_install_into_pytorch covers install()")
        r = run_python(f"import tensorpool; tensorpool.install('backend:{BACKEND}')")
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(r.stderr, "needs PyTorch|not the plain C library")

    def test_install_into_pytorch(self):
        """PyTorch's own CUDAPluggableAllocator loads the library and looks the functions up by
        name; no GPU is needed for that (CUDA is not initialized). A second install is refused."""
        if not torch_importable():
            self.skipTest("torch is not importable")
        if not hasattr(tensorpool._library(), "tensorpool_torch_malloc"):
            self.skipTest("this build's library is the plain C library")
        r = run_python(
            "import tensorpool, torch\n"
            f"tensorpool.install('backend:{BACKEND}')\n"
            "print('installed:', type(torch.cuda.memory._get_current_allocator()).__name__)\n"
            "try:\n"
            f"    tensorpool.install('backend:{BACKEND}')\n"
            "except tensorpool.TensorpoolError as e:\n"
            "    print('second install:', e)\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("installed: _CUDAAllocator", r.stdout)
        self.assertIn("second install: tensorpool.install(): PyTorch refused the allocator", r.stdout)


SLEEP_SCRIPT = """
import ctypes, tensorpool
lib = tensorpool._library()
MiB = 1 << 20
def alloc(size):
    out = ctypes.c_void_p()
    tensorpool._check(lib.tensorpool_alloc(tensorpool._handle(0), size, 0, ctypes.byref(out)), "alloc")
    return out.value
try:
    tensorpool.wake(0)
except tensorpool.TensorpoolError as e:
    assert "without sleep()" in str(e), e
else:
    raise AssertionError("wake without sleep was accepted")
p = alloc(20 * MiB)
r = tensorpool.sleep(0)
assert r["asleep_blocks"] == 1 and r["asleep_allocated"] == 20 * MiB, r
assert r["released_bytes"] >= r["asleep_bytes"] >= 20 * MiB, r
assert tensorpool.memory_reserved(0) == 0
assert tensorpool.is_asleep(p, 0)
a = tensorpool.asleep(0)
assert a["asleep_bytes"] == r["asleep_bytes"] and a["asleep_blocks"] == 1, a
q = alloc(MiB)
assert not tensorpool.is_asleep(q, 0)
tensorpool.wake(0)
assert not tensorpool.is_asleep(p, 0)
assert tensorpool.asleep(0)["asleep_bytes"] == 0
assert tensorpool.memory_reserved(0) >= 20 * MiB
with tensorpool.tag("py.kv"):
    kv = alloc(4 * MiB)
plain = alloc(4 * MiB)
r = tensorpool.sleep(0, tag="py.kv", keep_contents=True)
assert r["asleep_blocks"] == 1, r
assert tensorpool.is_asleep(kv, 0) and not tensorpool.is_asleep(plain, 0)
try:
    tensorpool.sleep(0, tag="py.never")
except tensorpool.TensorpoolError as e:
    assert "no allocation was ever made" in str(e), e
else:
    raise AssertionError("a tag nothing was allocated under was accepted")
tensorpool.wake(0, tag="py.kv")
assert not tensorpool.is_asleep(kv, 0)
print("sleep-ok")
"""


GRAPH_SCRIPT = """
import ctypes, tensorpool
lib = tensorpool._library()
MiB = 1 << 20
def alloc(size, stream=0):
    out = ctypes.c_void_p()
    tensorpool._check(lib.tensorpool_alloc(tensorpool._handle(0), size, stream, ctypes.byref(out)), "alloc")
    return out.value
def free(p):
    tensorpool._check(lib.tensorpool_free(tensorpool._handle(0), ctypes.c_void_p(p)), "free")
pool = tensorpool.begin_capture(0, reserve=16 * MiB, device=0)
a = alloc(10 * MiB)
try:
    alloc(10 * MiB)
except tensorpool.TensorpoolOutOfMemoryError as e:
    assert "reserve at least" in str(e), e
else:
    raise AssertionError("the graph pool served more than it holds")
(info,) = tensorpool.graph_pools(0)
assert info["id"] == pool and info["allocated"] == 10 * MiB and info["capturing_streams"] == 1, info
assert info["reserved"] >= 16 * MiB and not info["released"], info
try:
    tensorpool.empty_cache()
except tensorpool.TensorpoolError as e:
    assert "end_capture first" in str(e), e
else:
    raise AssertionError("empty_cache during a capture was accepted")
tensorpool.end_capture(0, device=0)
assert tensorpool.begin_capture(0, device=0, pool=pool) == pool  # a second graph shares it
tensorpool.end_capture(0, device=0)
tensorpool.release_graph(pool, device=0)
assert tensorpool.graph_pools(0)[0]["released"]
free(a)
assert tensorpool.graph_pools(0) == []
assert tensorpool.memory_allocated(0) == 0
print("graphs-ok")
"""


class GraphTest(unittest.TestCase):
    def test_a_graph_pool_serves_its_capture_and_goes_with_its_last_block(self):
        r = run_python(GRAPH_SCRIPT, TENSORPOOL_CONF=f"backend:{BACKEND}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("graphs-ok", r.stdout)


MEMPOOL_SCRIPT = """
import ctypes, tensorpool
lib = tensorpool._library()
MiB = 1 << 20
kv = tensorpool._pool_slot("py.kv_cache")
assert tensorpool._pool_slot("py.kv_cache") == kv
plain = tensorpool._pool_slot(None)
assert plain != kv
alloc = getattr(lib, f"tensorpool_torch_pool_malloc_{kv}")  # what a MemPool calls for a segment
alloc.argtypes, alloc.restype = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
segment = alloc(16 * MiB, 0, None)
assert segment, tensorpool._library().tensorpool_last_error()
r = tensorpool.sleep(0, tag="py.kv_cache")
assert r["asleep_blocks"] == 1 and tensorpool.is_asleep(segment, 0), r
tensorpool.wake(0, tag="py.kv_cache")
assert not tensorpool.is_asleep(segment, 0)
print("mempool-ok")
"""


class MemPoolTest(unittest.TestCase):
    def test_a_slot_allocates_under_its_tag_or_the_c_library_says_what_is_missing(self):
        r = run_python(MEMPOOL_SCRIPT, TENSORPOOL_CONF="backend:vmm" if BACKEND != "simulated" else "backend:simulated")
        if BACKEND == "simulated":  # libtensorpool_c: no PyTorch entry points
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("mem_pool needs libtensorpool_torch", r.stderr)
        else:
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("mempool-ok", r.stdout)


class SleepTest(unittest.TestCase):
    def test_sleep_and_wake_in_the_virtual_memory_mode(self):
        backend = "simulated" if BACKEND == "simulated" else "vmm"
        r = run_python(SLEEP_SCRIPT, TENSORPOOL_CONF=f"backend:{backend}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("sleep-ok", r.stdout)

    def test_fixed_segments_refuse_to_sleep(self):
        r = run_python("import tensorpool\ntensorpool.sleep(0)", TENSORPOOL_CONF=f"backend:{BACKEND},mode:fixed"
                       if BACKEND == "simulated" else f"backend:{BACKEND}")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("mode:vmm", r.stderr)


class RecordingTest(unittest.TestCase):
    """TENSORPOOL_TRACE records a run with no code change: allocations through the library (its
    PyTorch entry points where it has them) in a child interpreter, the file read back."""

    SIZES = [3 * MiB + 100, 700, 40 * MiB, 5000]

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "run-%p.tptrace")

    def tearDown(self):
        self.dir.cleanup()

    def run_recorded(self):
        here = os.path.dirname(os.path.abspath(__file__))
        r = run_python(
            f"import sys; sys.path.insert(0, {here!r})\n"
            "import tensorpool, test_tensorpool_module as t\n"
            "t.setUpModule()\n"
            "w = t.Workload()\n"
            f"for size in {self.SIZES!r}: w.alloc(size)\n"
            "w.free_all()\n"
            "tensorpool.empty_cache()\n"
            "print('pid', __import__('os').getpid())\n",
            TENSORPOOL_TRACE=self.path)
        self.assertEqual(r.returncode, 0, r.stderr)
        pid = r.stdout.split()[-1]
        return self.path.replace("%p", pid)

    def test_the_file_is_complete_and_current(self):
        path = self.run_recorded()
        self.assertEqual(os.listdir(self.dir.name), [os.path.basename(path)])  # no .partial left
        with open(path, "rb") as f:
            head = f.read(12)
        self.assertEqual(head[:8], b"\x89TPT\r\n\x1a\n")
        self.assertEqual(int.from_bytes(head[8:12], "little"), 3)  # the format version written

    @unittest.skipUnless(os.environ.get("TENSORPOOL_CLI"), "TENSORPOOL_CLI not set")
    def test_tensorpool_info_reads_it(self):
        path = self.run_recorded()
        out = cli("info", path, "--json")
        info = json.loads(out)
        self.assertEqual(info["source"], "tensorpool-recording")
        self.assertEqual(info["devices"], [0])
        self.assertEqual(info["ops"]["alloc"], len(self.SIZES))
        self.assertEqual(info["ops"]["free_requested"], len(self.SIZES))
        self.assertEqual(info["ops"]["empty_cache"], 1)
        self.assertEqual(info["peak_requested_bytes"], sum(self.SIZES))
        config = [m for m in info["metadata"] if m.startswith("config=")]
        self.assertEqual(len(config), 1, info["metadata"])
        self.assertIn("max_split_size:", config[0])  # the settings a replay takes ...
        self.assertNotIn("backend", config[0])       # ... without the registry's backend key


def torch_python():
    """An interpreter that imports torch: this one, TENSORPOOL_TORCH_PYTHON, or the project's
    .venv-torch (scripts/install-deps.sh torch); None without one."""
    if torch_importable():
        return sys.executable
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    other = os.environ.get("TENSORPOOL_TORCH_PYTHON") or os.path.join(root, ".venv-torch", "bin", "python")
    return other if os.path.isfile(other) else None


def torch_importable():
    try:
        import torch  # noqa: F401
        return True
    except Exception:
        return False


@unittest.skipUnless(os.environ.get("TENSORPOOL_CLI"), "TENSORPOOL_CLI not set")
class AnalysesTest(unittest.TestCase):
    """tensorpool.compare/fit/info/report: the CLI's answers, as plain data, and its errors."""

    @classmethod
    def setUpClass(cls):
        # The analyses run the CLI as a child: without the sanitizer runtime this interpreter
        # may preload (see cli()); restored for the other tests' child interpreters.
        cls.preload = os.environ.pop("LD_PRELOAD", None)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.trace = os.path.join(cls.tmp.name, "small.tptrace")
        cli("generate", cls.trace, "--options",
            "layers:2,hidden:256,heads:4,kv_heads:4,ffn:1024,vocab:1000,context:128,seq:128,micro_batch:2,steps:2")
        cls.snapshot = os.path.join(cls.tmp.name, "small.pickle")
        cli("export", cls.trace, "-o", cls.snapshot, "-q")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        if cls.preload is not None:
            os.environ["LD_PRELOAD"] = cls.preload

    def test_answers_equal_the_clis(self):
        allocators = ["tensorpool", "pytorch"]
        for name, function in (("compare", tensorpool.compare), ("fit", tensorpool.fit)):
            expected = json.loads(cli(name, self.trace, "--json", "-q", "--allocators", ",".join(allocators)))
            got = function(self.trace, allocators=allocators)
            self.assertEqual(without_timings(got), without_timings(expected), name)
        self.assertEqual(tensorpool.info(self.trace), json.loads(cli("info", self.trace, "--json")))
        # Options: a flag, a number, a dict repeated as NAME=VALUE.
        got = tensorpool.compare(self.trace, allocators=["tensorpool"], warmup=1, capacity="8GiB",
                                 allocator_conf={"tensorpool": "max_split_size:64MiB"})
        expected = json.loads(cli("compare", self.trace, "--json", "-q", "--allocators", "tensorpool",
                                  "--warmup", "1", "--capacity", "8GiB",
                                  "--allocator-conf", "tensorpool=max_split_size:64MiB"))
        self.assertEqual(without_timings(got), without_timings(expected))

    def test_plan_is_the_clis(self):
        small = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn": 1024, "vocab": 1000, "seq": 128}
        text = ",".join(f"{k}:{v}" for k, v in small.items())
        got = tensorpool.plan("custom", 8, options=small, capacity="1GiB", allocators=["tensorpool", "pytorch"])
        expected = json.loads(cli("plan", "--model", "custom", "--global-batch", "8", "--options", text,
                                  "--capacity", "1GiB", "--allocators", "tensorpool,pytorch", "--json", "-q"))
        self.assertEqual(without_timings(got), without_timings(expected))
        self.assertIn("Answer:", got["answer"]["text"])
        self.assertEqual(tensorpool.plan("custom", 8, options=text, capacity="1GiB", allocators=["tensorpool"])["answer"],
                         tensorpool.plan("custom", 8, options=small, capacity="1GiB", allocators=["tensorpool"])["answer"])
        with self.assertRaises(tensorpool.TensorpoolCliError) as refused:
            tensorpool.plan("llama2-7b", 8, options={"tp": 2})
        self.assertIn("add framework:megatron", str(refused.exception))
        self.assertEqual(refused.exception.returncode, 2)

    def test_a_snapshot_dict_is_the_snapshot_file(self):
        snapshot = load_plain(self.snapshot)
        self.assertIsInstance(snapshot, dict)
        from_dict = tensorpool.fit(snapshot, allocators=["tensorpool"])
        from_file = tensorpool.fit(self.snapshot, allocators=["tensorpool"])
        self.assertEqual(without_timings(from_dict), without_timings(from_file))
        self.assertEqual(from_dict["trace"], "<snapshot dict>")

    def test_report(self):
        report = tensorpool.report(self.trace, allocators=["tensorpool", "pytorch"])
        self.assertIsNone(report.path)
        self.assertTrue(report.html.lstrip().lower().startswith("<!doctype html>"))
        self.assertTrue(report._repr_html_().startswith('<iframe srcdoc="&lt;!'))
        kept = os.path.join(self.tmp.name, "report.html")
        again = tensorpool.report(self.trace, kept, allocators=["tensorpool"])
        self.assertEqual(again.path, kept)
        with open(kept, encoding="utf-8") as f:
            self.assertEqual(f.read(), again.html)

    def test_bad_input_raises_the_clis_message(self):
        truncated = os.path.join(self.tmp.name, "truncated.pickle")
        with open(self.snapshot, "rb") as f, open(truncated, "wb") as out:
            out.write(f.read(200))
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        done = subprocess.run([os.environ["TENSORPOOL_CLI"], "fit", truncated, "--json"],
                              capture_output=True, text=True, env=env)
        self.assertEqual(done.returncode, 1)
        with self.assertRaises(tensorpool.TensorpoolCliError) as caught:
            tensorpool.fit(truncated)
        self.assertEqual(str(caught.exception), done.stderr.strip())
        self.assertIn("offset", str(caught.exception))
        self.assertEqual(caught.exception.returncode, 1)
        with self.assertRaises(tensorpool.TensorpoolCliError) as caught:
            tensorpool.compare(self.trace, no_such_option=3)
        self.assertEqual(caught.exception.returncode, 2)
        self.assertIn("--no-such-option", str(caught.exception))
        with self.assertRaises(tensorpool.TensorpoolCliError):
            tensorpool.info(os.path.join(self.tmp.name, "absent.pickle"))
        with self.assertRaises(TypeError):
            tensorpool.fit(42)

    def test_python_m_tensorpool_is_the_cli(self):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        own = subprocess.run(["bash", "-c", 'exec -a tensorpool "$0" --help', os.environ["TENSORPOOL_CLI"]],
                             capture_output=True, text=True, env=env, check=True).stdout
        module = subprocess.run([sys.executable, "-m", "tensorpool", "--help"], capture_output=True,
                                text=True, env=env, check=True).stdout
        self.assertEqual(module, own)
        missing = subprocess.run([sys.executable, "-m", "tensorpool", "--help"], capture_output=True, text=True,
                                 env=dict(env, TENSORPOOL_CLI=os.path.join(self.tmp.name, "absent")))
        self.assertEqual(missing.returncode, 2)
        self.assertIn("TENSORPOOL_CLI=", missing.stderr)


if __name__ == "__main__":
    unittest.main()
