"""tensorpool for PyTorch: a pure-Python (ctypes) module over libtensorpool_torch.so.

    import tensorpool
    tensorpool.install()                 # before the first CUDA allocation
    ...                                  # train as usual
    print(tensorpool.memory_summary())
    tensorpool.record_history(True)
    ...
    tensorpool.dump_snapshot("snapshot.pickle")   # open it at pytorch.org/memory_viz

Under a pluggable allocator, PyTorch's own torch.cuda.memory_stats(), memory_summary(),
memory_allocated() and memory._snapshot() raise, and torch.cuda.empty_cache(),
set_per_process_memory_fraction() and Tensor.record_stream() do nothing (PyTorch's Python
CUDAPluggableAllocator cannot set the hooks behind them). This module provides them, with
PyTorch's key names. See docs/pytorch.md.

The library is found, in this order, at $TENSORPOOL_LIBRARY, next to this file
(libtensorpool_torch.so, else the plain C library libtensorpool_c.so, which has everything but
install()), then by the dynamic loader's search path (LD_LIBRARY_PATH, ...). Settings come
from TENSORPOOL_CONF or install(conf=...) ("key:value,...", with
backend:async|malloc|vmm|simulated). With
TENSORPOOL_TRACE=path the library records every device's allocator events into a trace file
(docs/recording.md).

tensorpool.capture traces your own PyTorch job without a GPU (python -m tensorpool.capture --out
job.tptrace train.py; docs/capture.md). The analyses of the CLI (compare, fit, info, report) are here too, on a trace file or a
snapshot dict, and plan on a model, returning plain data (tensorpool.analysis); `tensorpool` on the command line and
`python -m tensorpool` run the CLI installed with the package (pip install .).
"""

import collections
import contextlib
import ctypes
import os
import threading

__all__ = [
    "TensorpoolError",
    "TensorpoolConfigError",
    "install",
    "configure",
    "library_path",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "memory_summary",
    "empty_cache",
    "step",
    "step_after_optimizer",
    "set_memory_fraction",
    "record_stream",
    "sleep",
    "wake",
    "tag",
    "asleep",
    "is_asleep",
    "begin_capture",
    "end_capture",
    "release_graph",
    "graph_pools",
    "mem_pool",
    "record_history",
    "dump_snapshot",
    "compare",
    "fit",
    "info",
    "plan",
    "report",
    "Report",
    "TensorpoolCliError",
]

_LIBRARY_NAME = "libtensorpool_torch.so"
_C_LIBRARY_NAME = "libtensorpool_c.so"
_ALLOC_FN = "tensorpool_torch_malloc"
_FREE_FN = "tensorpool_torch_free"

# tensorpool_status values (tensorpool/tensorpool.h).
_OK = 0
_ERROR_CONFIG = 2
_ERROR_OUT_OF_MEMORY = 3
_ERROR_IO = 7


class TensorpoolError(RuntimeError):
    """A failed tensorpool call; `status` is the C API's status name."""

    def __init__(self, message, status="TENSORPOOL_ERROR_INTERNAL"):
        super().__init__(message)
        self.status = status


class TensorpoolConfigError(TensorpoolError, ValueError):
    """A bad setting (TENSORPOOL_CONF or install(conf=...)); the message names the key."""


class TensorpoolOutOfMemoryError(TensorpoolError, MemoryError):
    """The allocator could not serve a request; the message explains why."""


_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    env = os.environ.get("TENSORPOOL_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    beside = [os.path.join(here, name) for name in (_LIBRARY_NAME, _C_LIBRARY_NAME)]
    found = [path for path in beside if os.path.exists(path)]
    return found[:1] if found else [_LIBRARY_NAME]


class _SleepReport(ctypes.Structure):  # tensorpool_sleep_report
    _fields_ = [("released_bytes", ctypes.c_uint64), ("asleep_bytes", ctypes.c_uint64),
                ("asleep_blocks", ctypes.c_uint64), ("asleep_allocated", ctypes.c_uint64),
                ("kept_bytes", ctypes.c_uint64)]

    def as_dict(self):
        return {name: int(getattr(self, name)) for name, _ in self._fields_}


class _GraphPoolInfo(ctypes.Structure):  # tensorpool_graph_pool_info
    _fields_ = [("id", ctypes.c_uint64), ("reserved", ctypes.c_uint64), ("allocated", ctypes.c_uint64),
                ("peak_allocated", ctypes.c_uint64), ("blocks", ctypes.c_uint64),
                ("largest_free", ctypes.c_uint64), ("capturing_streams", ctypes.c_uint64),
                ("released", ctypes.c_int)]

    def as_dict(self):
        d = {name: int(getattr(self, name)) for name, _ in self._fields_}
        d["released"] = bool(d["released"])
        return d


def _declare(lib):
    p, i, sz, u64, d = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_double
    pp = ctypes.POINTER(ctypes.c_void_p)
    signatures = {
        "tensorpool_last_error": ([], ctypes.c_char_p),
        "tensorpool_status_name": ([i], ctypes.c_char_p),
        "tensorpool_configure": ([ctypes.c_char_p], i),
        "tensorpool_device_allocator": ([i, pp], i),
        "tensorpool_existing_device_allocator": ([i, pp], i),
        "tensorpool_empty_cache_all": ([], i),
        "tensorpool_step_all": ([], i),
        "tensorpool_record_history_all": ([i, sz], i),
        "tensorpool_dump_snapshot": ([ctypes.c_char_p], i),
        "tensorpool_alloc": ([p, sz, u64, pp], i),
        "tensorpool_free": ([p, p], i),
        "tensorpool_record_stream": ([p, p, u64], i),
        "tensorpool_set_memory_fraction": ([p, d], i),
        "tensorpool_reset_peaks": ([p], i),
        "tensorpool_check_invariants": ([p], i),
        "tensorpool_stats_json": ([p, ctypes.c_char_p, sz, ctypes.POINTER(sz)], i),
        "tensorpool_sleep": ([p, ctypes.c_char_p, i, ctypes.POINTER(_SleepReport)], i),
        "tensorpool_wake": ([p, ctypes.c_char_p], i),
        "tensorpool_push_tag": ([ctypes.c_char_p], i),
        "tensorpool_pop_tag": ([], i),
        "tensorpool_asleep": ([p, ctypes.POINTER(_SleepReport)], i),
        "tensorpool_is_asleep": ([p, p, ctypes.POINTER(i)], i),
        "tensorpool_begin_capture": ([p, u64, sz, ctypes.POINTER(u64)], i),
        "tensorpool_join_capture": ([p, u64, u64, sz], i),
        "tensorpool_end_capture": ([p, u64], i),
        "tensorpool_release_graph": ([p, u64], i),
        "tensorpool_graph_pools": ([p, ctypes.POINTER(_GraphPoolInfo), sz, ctypes.POINTER(sz)], i),
    }
    if hasattr(lib, "tensorpool_torch_pool_bind"):  # libtensorpool_torch only (mem_pool)
        signatures["tensorpool_torch_pool_bind"] = ([ctypes.c_char_p, ctypes.POINTER(i)], i)
    for name, (args, res) in signatures.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res


def _library():
    """The loaded library (loaded once; thread-safe)."""
    global _lib, _path
    with _lock:
        if _lib is None:
            errors = []
            for candidate in _candidates():
                try:
                    lib = ctypes.CDLL(candidate)
                except OSError as e:
                    errors.append(f"{candidate}: {e}")
                    continue
                _declare(lib)
                _lib, _path = lib, candidate
                break
            if _lib is None:
                raise OSError(
                    "tensorpool: cannot load the library (set TENSORPOOL_LIBRARY to the path of "
                    f"{_LIBRARY_NAME}): " + "; ".join(errors))
        return _lib


def library_path():
    """The path (or name) the library was loaded from."""
    _library()
    return _path


def _check(status, what):
    if status == _OK:
        return
    lib = _library()
    message = lib.tensorpool_last_error().decode("utf-8", "replace")
    name = lib.tensorpool_status_name(status).decode()
    cls = {_ERROR_CONFIG: TensorpoolConfigError,
           _ERROR_OUT_OF_MEMORY: TensorpoolOutOfMemoryError}.get(status, TensorpoolError)
    raise cls(f"tensorpool: {what}: {message}", name)


def _existing(device):
    """The registry's handle of `device`, or None when its allocator does not exist yet."""
    handle = ctypes.c_void_p()
    _check(_library().tensorpool_existing_device_allocator(int(device), ctypes.byref(handle)),
           f"device {device}")
    return handle if handle.value else None


def _handle(device):
    """The registry's handle of `device`, created if needed."""
    handle = ctypes.c_void_p()
    _check(_library().tensorpool_device_allocator(int(device), ctypes.byref(handle)),
           f"device {device}")
    return handle


def _device_index(device):
    if device is None:
        try:
            import torch
            if torch.cuda.is_initialized():
                return torch.cuda.current_device()
        except ImportError:
            pass
        return 0
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)  # torch.device
    if index is None and isinstance(device, str):
        index = int(device.split(":")[1]) if ":" in device else 0
    return 0 if index is None else int(index)


def configure(conf=None):
    """Sets the settings of the device allocators not created yet ("key:value,...");
    None re-reads TENSORPOOL_CONF. Raises TensorpoolConfigError naming a bad key, and
    TensorpoolError once an allocator exists."""
    _check(_library().tensorpool_configure(None if conf is None else conf.encode()), "configure")


def install(conf=None):
    """Makes tensorpool PyTorch's CUDA allocator. Call it before anything allocates CUDA memory
    (PyTorch cannot swap an allocator it has initialized). `conf` overrides TENSORPOOL_CONF.
    The settings are checked first: a bad key raises TensorpoolConfigError naming it."""
    lib = _library()
    configure(conf)
    if not hasattr(lib, _ALLOC_FN):
        raise TensorpoolError(f"tensorpool: {_path} has no {_ALLOC_FN}: install() needs "
                              f"{_LIBRARY_NAME}, not the plain C library")
    try:
        import torch
    except ImportError as e:
        raise ImportError("tensorpool.install() needs PyTorch (import torch failed)") from e
    if not hasattr(torch._C, "_cuda_customAllocator"):
        raise TensorpoolError("tensorpool.install(): this PyTorch has no CUDA support")
    if torch.cuda.is_initialized():
        raise TensorpoolError(
            "tensorpool.install() must run before CUDA is initialized: PyTorch has already set up "
            "its own allocator (call install() at the top of the script, before any tensor is "
            "moved to the GPU or torch.cuda is used)")
    allocator = torch.cuda.memory.CUDAPluggableAllocator(_path, _ALLOC_FN, _FREE_FN)
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise TensorpoolError(f"tensorpool.install(): PyTorch refused the allocator: {e}") from e


def memory_stats_as_nested_dict(device=None):
    """PyTorch's torch.cuda.memory_stats_as_nested_dict() for tensorpool; {} before the device's
    first allocation."""
    import json
    handle = _existing(_device_index(device))
    if handle is None:
        return {}
    lib = _library()
    needed = ctypes.c_size_t(0)
    lib.tensorpool_stats_json(handle, None, 0, ctypes.byref(needed))
    for _ in range(4):  # the figures may grow between the two calls
        buffer = ctypes.create_string_buffer(needed.value + 256)
        status = lib.tensorpool_stats_json(handle, buffer, len(buffer), ctypes.byref(needed))
        if status == _OK:
            return json.loads(buffer.value.decode())
    _check(status, "memory_stats")
    return {}


def memory_stats(device=None):
    """PyTorch's torch.cuda.memory_stats() for tensorpool: a flat, sorted OrderedDict with
    PyTorch's key names ("allocated_bytes.all.current", "reserved_bytes.all.peak", ...)."""
    flat = []

    def walk(prefix, value):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            flat.append((prefix, value))

    walk("", memory_stats_as_nested_dict(device))
    flat.sort()
    return collections.OrderedDict(flat)


def _stat(device, key):
    return memory_stats(device).get(key, 0)


def memory_allocated(device=None):
    return _stat(device, "allocated_bytes.all.current")


def max_memory_allocated(device=None):
    return _stat(device, "allocated_bytes.all.peak")


def memory_reserved(device=None):
    return _stat(device, "reserved_bytes.all.current")


def max_memory_reserved(device=None):
    return _stat(device, "reserved_bytes.all.peak")


def reset_peak_memory_stats(device=None):
    handle = _existing(_device_index(device))
    if handle is not None:
        _check(_library().tensorpool_reset_peaks(handle), "reset_peak_memory_stats")


def _format_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0


def memory_summary(device=None, abbreviated=False):
    """A table of the device allocator's statistics (current, peak, cumulative allocated and
    freed), like torch.cuda.memory_summary(). abbreviated: totals only, no per-pool rows."""
    index = _device_index(device)
    stats = memory_stats(index)
    title = f"tensorpool memory summary, device {index}"
    if not stats:
        return f"{title}: no allocation yet\n"
    rows = [("allocated memory", "allocated_bytes", True), ("active memory", "active_bytes", True),
            ("requested memory", "requested_bytes", True), ("reserved memory", "reserved_bytes", True),
            ("non-releasable memory", "inactive_split_bytes", True), ("allocations", "allocation", False),
            ("active blocks", "active", False), ("segments", "segment", False)]
    pools = [("all", "")] if abbreviated else [("all", ""), ("large_pool", "  large pool"),
                                               ("small_pool", "  small pool")]
    header = f"{'':<28}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"
    lines = [title, "=" * len(header), header, "-" * len(header)]
    for label, key, is_bytes in rows:
        for pool, suffix in pools:
            values = [stats.get(f"{key}.{pool}.{m}", 0) for m in ("current", "peak", "allocated", "freed")]
            cells = [_format_bytes(v) if is_bytes else str(v) for v in values]
            lines.append(f"{(label if not suffix else suffix):<28}" + "".join(f"{c:>14}" for c in cells))
    lines.append("-" * len(header))
    lines.append(f"retries {stats['num_alloc_retries']}, OOMs {stats['num_ooms']}, device allocations "
                 f"{stats['num_device_alloc']}, device frees {stats['num_device_free']}, "
                 f"host syncs {stats['num_sync_all_streams']}")
    lines.append("non-releasable memory (free blocks inside used segments) is the current value only; "
                 "its peak and totals are not tracked (0)")
    return "\n".join(lines) + "\n"


def empty_cache():
    """Returns every free cached segment of every device to the device (what
    torch.cuda.empty_cache() does for PyTorch's own allocator)."""
    _check(_library().tensorpool_empty_cache_all(), "empty_cache")


def step():
    """Marks the end of a training step on every device (call it once per step, always at the
    same point: after optimizer.zero_grad(), or right after optimizer.step()). In the
    virtual-memory mode, the allocations each step makes around what stays allocated (weights,
    optimizer states) are planned, and the next step that makes the same ones is served at the
    planned places; a step whose kept tensors (the logits) replaced the last step's is planned in
    this call as itself and as its mirror, which the next step follows (docs/vmm.md, "Steps").
    No synchronization."""
    _check(_library().tensorpool_step_all(), "step")


def step_after_optimizer():
    """Calls step() after every optimizer.step() of every torch.optim optimizer in this process
    (torch.optim.optimizer.register_optimizer_step_post_hook), so that a training loop marks its
    steps without a call of its own. Returns torch's handle: handle.remove() stops it. With more
    than one optimizer, each one's step() is a boundary (still at the same points of every
    step). Needs PyTorch."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError as e:
        raise TensorpoolError(f"tensorpool.step_after_optimizer() needs PyTorch (torch.optim): {e}") from e
    _library()  # a library that cannot be loaded fails here, not inside the first optimizer.step()
    return register_optimizer_step_post_hook(lambda optimizer, args, kwargs: step())


def set_memory_fraction(fraction, device=None):
    """Caps the device allocator's reserved memory at `fraction` (0..1) of the device."""
    _check(_library().tensorpool_set_memory_fraction(_handle(_device_index(device)), float(fraction)),
           "set_memory_fraction")


def _stream_handle(stream):
    """A torch.cuda.Stream's cudaStream_t, or `stream` itself (an int, or None for the default)."""
    return int(getattr(stream, "cuda_stream", stream) or 0)


def _tag_name(tag):
    """A tag for the C API: its name as bytes, or None for no tag."""
    return None if tag is None else str(tag).encode()


def record_stream(tensor, stream):
    """Marks the memory of `tensor` (or a device pointer, an int) as used on `stream` (a
    torch.cuda.Stream or a cudaStream_t as an int): it is reused only after the work queued on
    that stream before the free completes. Use it instead of Tensor.record_stream(), which a
    pluggable allocator cannot see."""
    if isinstance(tensor, int):
        ptr, devices = tensor, range(64)
    else:
        ptr = tensor.untyped_storage().data_ptr()
        devices = [tensor.device.index]
    lib = _library()
    last = None
    for device in devices:
        handle = _existing(device)
        if handle is None:
            continue
        status = lib.tensorpool_record_stream(handle, ctypes.c_void_p(ptr), _stream_handle(stream))
        if status == _OK:
            return
        last = status
    if last is None:
        raise TensorpoolError(f"tensorpool: record_stream: no device allocator holds {ptr:#x}",
                              "TENSORPOOL_ERROR_USAGE")
    _check(last, "record_stream")


@contextlib.contextmanager
def tag(name):
    """A scope in which this thread's allocations carry the tag `name` (nested scopes: the
    innermost), so that sleep(tag=name) gives back their memory alone:

        with tensorpool.tag("kv_cache"):
            kv = torch.empty(...)
        tensorpool.sleep(tag="kv_cache")

    Tagged tensors come from memory of their own."""
    lib = _library()
    _check(lib.tensorpool_push_tag(str(name).encode()), f"tag({name!r})")
    try:
        yield
    finally:
        _check(lib.tensorpool_pop_tag(), f"tag({name!r})")


def sleep(device=None, tag=None, keep_contents=False):
    """Virtual-memory mode (backend:vmm): gives the physical memory under every block of the
    device's allocator (with `tag`: under the blocks allocated in tensorpool.tag(tag) alone) back
    to the device while each live tensor keeps its address (as vLLM's sleep mode does). The
    tensors must not be used until wake(). With keep_contents their bytes are copied to pinned
    host memory first and back at wake() (else they are lost). The device is synchronized first;
    allocations made meanwhile get other memory; a tensor freed meanwhile is forgotten; a second
    sleep does nothing. Returns a dict: released_bytes, asleep_bytes (what wake() maps back),
    asleep_blocks, asleep_allocated, kept_bytes. Raises TensorpoolError with the fixed-segment
    backends (async, malloc), or for a tag nothing was allocated under. See docs/vmm.md, "Sleep
    and wake"."""
    report = _SleepReport()
    _check(_library().tensorpool_sleep(_handle(_device_index(device)), _tag_name(tag), 1 if keep_contents else 0,
                                       ctypes.byref(report)), "sleep")
    return report.as_dict()


def wake(device=None, tag=None):
    """Maps new pages under every tensor sleep() left asleep (with `tag`: those of the tag),
    at the same addresses, and copies back kept contents. Raises TensorpoolError with no sleep()
    (of that tag, or of all) since the last wake() (after one, never: even when it found nothing
    to put to sleep), or when the device cannot give the pages (then everything stays asleep)."""
    _check(_library().tensorpool_wake(_handle(_device_index(device)), _tag_name(tag)), "wake")


def asleep(device=None):
    """What sleeps now on the device (the dict of sleep(); all zero while awake)."""
    report = _SleepReport()
    handle = _existing(_device_index(device))
    if handle is not None:
        _check(_library().tensorpool_asleep(handle, ctypes.byref(report)), "asleep")
    return report.as_dict()


def is_asleep(tensor, device=None):
    """Whether the memory of `tensor` (or a device pointer, an int) is asleep."""
    if isinstance(tensor, int):
        ptr = tensor
    else:
        ptr = tensor.untyped_storage().data_ptr()
        device = tensor.device.index if device is None else device
    out = ctypes.c_int()
    _check(_library().tensorpool_is_asleep(_handle(_device_index(device)), ctypes.c_void_p(ptr), ctypes.byref(out)),
           "is_asleep")
    return bool(out.value)


def begin_capture(stream, reserve=0, device=None, pool=None):
    """CUDA graphs: serves every allocation on `stream` (a torch.cuda.Stream or a cudaStream_t as an
    int) from a graph pool, with no device call and no synchronization, until end_capture(stream).
    Without `pool`: a new pool of `reserve` bytes (> 0). With `pool` (an id this returned before):
    that pool, `reserve` more bytes reserved for it first (0: none). Call it before the capture
    begins (before torch.cuda.graph's capture, or cudaStreamBeginCapture). Returns the pool's id. A
    request the pool cannot serve raises TensorpoolOutOfMemoryError saying how much to reserve.
    See docs/graphs.md."""
    lib, handle = _library(), _handle(_device_index(device))
    if pool is None:
        out = ctypes.c_uint64()
        _check(lib.tensorpool_begin_capture(handle, _stream_handle(stream), int(reserve), ctypes.byref(out)),
               "begin_capture")
        return int(out.value)
    _check(lib.tensorpool_join_capture(handle, _stream_handle(stream), int(pool), int(reserve)), "begin_capture")
    return int(pool)


def end_capture(stream, device=None):
    """Stops serving `stream` from its graph pool."""
    _check(_library().tensorpool_end_capture(_handle(_device_index(device)), _stream_handle(stream)), "end_capture")


def release_graph(pool, device=None):
    """The graph of `pool` is gone: once the pool's last tensor is freed, its memory is cache again."""
    _check(_library().tensorpool_release_graph(_handle(_device_index(device)), int(pool)), "release_graph")


def graph_pools(device=None):
    """The device's graph pools not yet given back, as dicts: id, reserved, allocated,
    peak_allocated, blocks, largest_free, capturing_streams, released."""
    handle = _existing(_device_index(device))
    if handle is None:
        return []
    lib, count = _library(), ctypes.c_size_t()
    _check(lib.tensorpool_graph_pools(handle, None, 0, ctypes.byref(count)), "graph_pools")
    infos = (_GraphPoolInfo * max(count.value, 1))()
    _check(lib.tensorpool_graph_pools(handle, infos, count.value, ctypes.byref(count)), "graph_pools")
    return [infos[k].as_dict() for k in range(min(count.value, len(infos)))]


def _pool_slot(tag):
    """The MemPool slot of `tag` in libtensorpool_torch (tensorpool_torch_pool_bind)."""
    lib = _library()
    bind = getattr(lib, "tensorpool_torch_pool_bind", None)
    if bind is None:
        raise TensorpoolError(f"tensorpool: mem_pool needs libtensorpool_torch; {_path} has no MemPool slots",
                              "TENSORPOOL_ERROR_UNAVAILABLE")
    slot = ctypes.c_int(-1)
    _check(bind(_tag_name(tag), ctypes.byref(slot)), f"mem_pool(tag={tag!r})")
    return slot.value


def mem_pool(tag=None):
    """A torch.cuda.MemPool (PyTorch 2.5 and later) whose segments come from tensorpool, allocated
    under `tag` (None: untagged), so that part of a program can use tensorpool while PyTorch's
    allocator serves the rest, and that part can sleep alone:

        pool = tensorpool.mem_pool(tag="kv_cache")
        with torch.cuda.use_mem_pool(pool):
            kv = torch.empty(kv_shape, device="cuda")
        tensorpool.sleep(tag="kv_cache")   # backend:vmm: the pool's pages back to the device
        tensorpool.wake(tag="kv_cache")

    Each distinct tag takes one of libtensorpool_torch's 16 slots for the life of the process."""
    slot = _pool_slot(tag)
    import torch  # only here: the rest of the module works without PyTorch
    allocator = torch.cuda.memory.CUDAPluggableAllocator(library_path(), f"tensorpool_torch_pool_malloc_{slot}",
                                                         "tensorpool_torch_free")
    return torch.cuda.MemPool(allocator.allocator())


def record_history(enabled=True, max_entries=100000):
    """Starts (or, enabled=False, stops and forgets) recording allocator events on every device
    for dump_snapshot(), keeping the newest max_entries per device; like
    torch.cuda.memory._record_memory_history(). Stack frames are not recorded."""
    _check(_library().tensorpool_record_history_all(1 if enabled else 0, int(max_entries)),
           "record_history")


def dump_snapshot(path="dump_snapshot.pickle"):
    """Writes a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's layout) of every
    device allocator to `path`: segments, blocks and, while recording, the event history.
    pytorch.org/memory_viz and torch.cuda._memory_viz open it. Written through a temporary file:
    a failure leaves no file behind."""
    _check(_library().tensorpool_dump_snapshot(os.fsencode(path)), f"dump_snapshot({path!r})")


# Last: the analyses' module imports TensorpoolError from here.
from tensorpool.analysis import Report, TensorpoolCliError, compare, fit, info, plan, report  # noqa: E402
