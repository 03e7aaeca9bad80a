"""tensorpool.capture: a user's own PyTorch job, traced without a GPU.

    python -m tensorpool.capture --out job.tptrace [--steps 2] train.py [ARGS...]

    from tensorpool import capture
    result = capture.run(main, out="job.tptrace", steps=2)   # main() builds the model and trains
    print(result.peak_bytes, result.allocations)

The job runs on this machine's CPU with every tensor faked (torch's FakeTensorMode: shapes and
dtypes, no memory, no values), so a job that needs 80 GiB of GPU memory is traced in seconds on a
laptop. Every storage the job would allocate on the GPU is recorded in order, with its size (the
bytes PyTorch's caching allocator would be asked for), its stream and the innermost frame of the
user's code that made it ("name (file:line)"), and when it dies; the trace (.tptrace or .jsonl,
docs/trace-format.md) is what `tensorpool fit`, `plan --capture`, `compare`, `info` and `report`
take.

What makes the CPU run allocate what the GPU run would (docs/capture.md):
- Devices. A tensor the program puts on "cuda" (device="cuda", .cuda(), .to("cuda"), a module's
  .to/.cuda, torch.set_default_device, with torch.device("cuda")) is made on the fake device
  cpu:1, which dispatches as the CPU but is a device of its own; what an op computes from it is
  on it too. Only its tensors are recorded; tensors the program keeps on the host (a batch
  before .to("cuda"), the optimizer's step counts) are not. DataLoaders load in this process.
- Autocast. torch.autocast("cuda", ...) becomes CPU autocast with CUDA's rules: the op lists of
  PyTorch's CUDA autocast (aten/src/ATen/autocast_mode.h: lower precision, fp32, fp32 with a
  dtype, promote) replace the CPU's, and ops only the CPU's lists cast are not cast; the cast of
  a weight is cached until autocast exits, as on the GPU.
- Optimizers choose their implementation as on a GPU (foreach by default; fused when asked).
- torch.cuda: is_available() is True and one device is there; Stream, Event, stream(),
  current_stream(), synchronize() (recorded as a stream_sync), empty_cache() (recorded),
  memory_allocated() and max_memory_allocated() (the capture's own figures) work; Tensor.record_stream
  is recorded. .item(), bool(), int() and float() of a tensor return a placeholder (0, with a
  warning naming the line: a capture has no values), so a step that logs its loss runs; an op
  whose output's size depends on values (nonzero, masked_select, unique) stops the capture with
  an error naming the op and the line.

Iterations: an `iteration` event follows each optimizer.step(); with steps=N the job is stopped
after its N-th optimizer step (the first step makes the optimizer's states, the second is the
steady state).

Needs torch (checked with 2.15: tests/python/test_capture.py). Nothing here needs a GPU or the
tensorpool libraries, but the tensorpool CLI (tensorpool._cli.executable()) to write .tptrace:
.jsonl is written directly. A program that raises is a ScriptError and writes nothing.
"""

import argparse
import contextlib
import functools
import json
import os
import runpy
import sys
import tempfile
import traceback
import warnings
import weakref

__all__ = ["CaptureError", "ScriptError", "CaptureResult", "Capture", "run", "run_script", "main"]


class CaptureError(RuntimeError):
    """The job cannot be captured (an op that needs values, a bad argument); the message names the
    call and the line of the user's code."""


class _StopCapture(BaseException):
    """Raised after the last optimizer step asked for: ends the user's loop (not an Exception, so
    the user's own `except Exception` does not swallow it)."""


def _torch():
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise CaptureError("tensorpool.capture needs PyTorch (pip install torch): " + str(e)) from e
    return torch


# --- where an allocation comes from ---------------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))


def _skipped_dirs():
    torch = _torch()
    dirs = [os.path.dirname(os.path.abspath(torch.__file__)), _HERE]
    for mod in ("contextlib", "functools", "runpy"):
        m = sys.modules.get(mod)
        if m is not None and getattr(m, "__file__", None):
            dirs.append(os.path.abspath(m.__file__))
    return tuple(dirs)


def _user_frame(skipped, start=2):
    """The innermost frame outside torch, this package and the standard library's plumbing, as
    (function, file, line); None when the stack has none."""
    f = sys._getframe(start)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith("<") and not os.path.abspath(name).startswith(skipped):
            return f.f_code.co_name, name, f.f_lineno
        f = f.f_back
    return None


def _label(frame):
    return "" if frame is None else f"{frame[0]} ({frame[1]}:{frame[2]})"


# --- CUDA autocast's op lists (PyTorch, aten/src/ATen/autocast_mode.h and .cpp) ---------------

# Each aten overload CUDA autocast registers, with its policy. Checked against the installed
# torch's own AutocastCUDA registrations (autocast_coverage()).
_LOWER = "lower_precision_fp"
_FP32 = "fp32"
_SET_OPT_DTYPE = "fp32_set_opt_dtype"
_APPEND_DTYPE = "fp32_append_dtype"
_PROMOTE = "promote"

_CUDA_AUTOCAST = {
    **dict.fromkeys([
        "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
        "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
        "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
        "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
        "cudnn_convolution", "cudnn_convolution_transpose", "_cudnn_rnn"], _LOWER),
    **dict.fromkeys([
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
        "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
        "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
        "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
        "rms_norm", "linalg_matrix_sqrth"], _FP32),
    **dict.fromkeys([
        "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname", "log_softmax.int",
        "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum", "cumsum.dimname", "linalg_vector_norm",
        "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList", "sum.dim_DimnameList"],
        _SET_OPT_DTYPE),
    "norm.Scalar": _APPEND_DTYPE,
    "norm.ScalarOpt_dim": _APPEND_DTYPE,
    "norm.names_ScalarOpt_dim": _APPEND_DTYPE,
    **dict.fromkeys(["addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
                     "index_put", "tensordot", "scatter_add"], _PROMOTE),
}

# Redispatch targets of fp32_append_dtype: the overload that takes the dtype.
_APPEND_TARGET = {"norm.Scalar": "ScalarOpt_dtype", "norm.ScalarOpt_dim": "ScalarOpt_dim_dtype",
                  "norm.names_ScalarOpt_dim": "names_ScalarOpt_dim_dtype"}


def _overload(name):
    torch = _torch()
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload or "default", None)


def autocast_coverage():
    """(registered but unknown, known but not registered): aten overloads the installed torch's
    CUDA autocast registers that the capture has no policy for, and policies for overloads it
    does not register (harmless: an op the GPU would not cast is never reached through them)."""
    torch = _torch()
    registered = {n[len("aten::"):] for n in torch._C._dispatch_get_all_op_names()
                  if n.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")}
    registered.discard("binary_cross_entropy")  # banned under autocast on both devices
    known = set(_CUDA_AUTOCAST)
    return sorted(registered - known), sorted(known - registered)


# --- the capture's state: GPU storages, events ----------------------------------------------

class _Storage:
    """A storage the capture has seen. `kind`: what the generator's labels call it (weights,
    grads, optimizer, activations, autocast, inputs, temporaries), once known; `phase`: what the
    program was doing when it was made (forward, backward, optimizer)."""
    __slots__ = ("addr", "size", "gpu", "ref", "kind", "phase", "frame")

    def __init__(self, addr, size, gpu, phase, kind, frame):
        self.addr, self.size, self.gpu, self.ref = addr, size, gpu, None
        self.phase, self.kind, self.frame = phase, kind, frame

    def label(self):
        """KIND:FRAME. Made in the forward pass and still live when a backward pass begins: an
        activation; anything else made in a pass and not named: a temporary."""
        return f"{self.kind or 'temporaries'}:{self.frame}"


class _Stream:
    """A torch.cuda.Stream of the capture: a number (0 is the default stream)."""
    _next = [1]

    def __init__(self, device=None, priority=0, stream_id=None, **_):
        if stream_id is None:
            stream_id = _Stream._next[0]
            _Stream._next[0] += 1
        self.stream_id = stream_id
        self.cuda_stream = stream_id
        self.device = "cuda:0"
        self.priority = priority

    def wait_stream(self, other): pass
    def wait_event(self, event): pass
    def record_event(self, event=None): return event if event is not None else _Event()
    def synchronize(self): _active().sync(self.stream_id)
    def query(self): return True
    def is_capturing(self): return False
    def __eq__(self, other): return isinstance(other, _Stream) and other.stream_id == self.stream_id
    def __hash__(self): return hash(self.stream_id)
    def __repr__(self): return f"<tensorpool.capture stream {self.stream_id}>"


class _Event:
    def __init__(self, *args, **kwargs): pass
    def record(self, stream=None): pass
    def wait(self, stream=None): pass
    def query(self): return True
    def synchronize(self): pass
    def elapsed_time(self, other): return 0.0


_STATE = []


def _active():
    if not _STATE:
        raise CaptureError("tensorpool.capture: no capture is running")
    return _STATE[-1]


class _Recorder:
    """The events of one capture, and what it knows of each storage it has seen."""

    BASE = 0x7F0000000000

    def __init__(self):
        self.events = []          # (op, addr, size, stream, label)
        self.storages = {}        # id(untyped storage) -> _Storage
        self.next_addr = self.BASE
        self.live = 0
        self.peak = 0
        self.allocations = 0
        self.stream = 0
        self.active = True
        self.skipped = _skipped_dirs()
        self.warned = set()
        self.steps = 0
        self.stop_after = None    # stop the job after this many optimizer steps
        self.phase = "forward"    # or backward, optimizer
        self.kind = None          # the kind of what is made now, when the capture knows it

    def see(self, storage, gpu):
        key = id(storage)
        entry = self.storages.get(key)
        if entry is not None:
            return entry
        size = storage.nbytes()
        recorded = gpu and size > 0
        frame = _label(_user_frame(self.skipped, 3)) if recorded else ""
        entry = _Storage(self.next_addr, size, gpu, self.phase, self.kind, frame)
        self.next_addr += max(512, (size + 511) // 512 * 512)
        entry.ref = weakref.ref(storage, functools.partial(self._died, key))
        self.storages[key] = entry
        if recorded:
            self.allocations += 1
            self.live += size
            self.peak = max(self.peak, self.live)
            self.events.append(("alloc", entry.addr, size, self.stream, entry))
        return entry

    def mark(self, tensors, kind):
        """The GPU storages of `tensors` are of `kind` (parameters, gradients, optimizer states)."""
        for t in tensors:
            if t is not None:
                entry = self.storages.get(id(t.untyped_storage()))
                if entry is not None and entry.gpu:
                    entry.kind = kind

    @contextlib.contextmanager
    def making(self, kind):
        before, self.kind = self.kind, kind
        try:
            yield
        finally:
            self.kind = before

    def backward_begins(self):
        """What the forward pass made and is still live is an activation."""
        for entry in self.storages.values():
            if entry.gpu and entry.kind is None and entry.phase == "forward":
                entry.kind = "activations"

    def _died(self, key, _ref):
        entry = self.storages.pop(key, None)
        if entry is None or not self.active or not entry.gpu or entry.size == 0:
            return
        self.live -= entry.size
        self.events.append(("free_requested", entry.addr, 0, self.stream, ""))
        self.events.append(("free_completed", entry.addr, 0, self.stream, ""))

    def sync(self, stream=None):
        self.events.append(("stream_sync", 0, 0, self.stream if stream is None else stream, ""))

    def empty_cache(self):
        self.events.append(("empty_cache", 0, 0, 0, ""))

    def record_stream(self, t, stream):
        entry = self.storages.get(id(t.untyped_storage()))
        if entry is not None and entry.gpu and entry.size > 0:
            self.events.append(("record_stream", entry.addr, 0, stream.stream_id, ""))

    def iteration(self):
        self.steps += 1
        self.events.append(("iteration", 0, self.steps, 0, ""))

    def warn_once(self, what):
        frame = _user_frame(self.skipped, 3)
        where = f"{frame[1]}:{frame[2]}" if frame else "an unknown line"
        if (what, where) in self.warned:
            return
        self.warned.add((what, where))
        warnings.warn(f"tensorpool.capture: {what} at {where} returned a placeholder (0): a capture has no "
                      "values, so memory follows it only if the program branches on it", stacklevel=4)

    def where(self):
        frame = _user_frame(self.skipped, 3)
        return f"{frame[1]}:{frame[2]} (in {frame[0]})" if frame else "an unknown line"


# --- the modes: every op's outputs; "cuda" as the fake GPU ----------------------------------

def _gpu_device():
    """The device the capture's GPU tensors are faked on: the CPU with index 1. Its tensors
    dispatch as CPU tensors (so autograd, autocast and every kernel run without CUDA) but are a
    device of their own: FakeTensorMode refuses to mix them with CPU tensors (but 0-dim ones), as
    CUDA does, and what an op makes from them is on it too."""
    return _torch().device("cpu", 1)


# Host tensors up to this size whose inputs are real are computed for real (docs/capture.md).
_REAL_HOST_BYTES = 1 << 20


def _modes(rec):
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    gpu = _gpu_device()
    aten = torch.ops.aten
    Tensor = torch.Tensor
    scalar_ops = {aten._local_scalar_dense.default}
    fake_errors = (torch._subclasses.fake_tensor.DataDependentOutputException,
                   torch._subclasses.fake_tensor.DynamicOutputShapeException)

    def small_host_values(out):
        return all(not isinstance(t, Tensor) or t.untyped_storage().nbytes() <= _REAL_HOST_BYTES for t in tree_leaves(out))

    class Outputs(TorchDispatchMode):
        """Below autograd and autocast, above FakeTensorMode: sees every aten op. A storage seen
        for the first time on the fake GPU is an allocation. An op of the host's own small
        tensors (an optimizer's step count, a loss scale, a batch of ids) runs for real, so their
        values are there when the program reads them."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
            on_gpu = kwargs.get("device") == gpu or any(t.device == gpu for t in tensors)
            real = not on_gpu and not any(isinstance(t, FakeTensor) for t in tensors)
            if func in scalar_ops and not real:
                rec.warn_once(".item() (or bool, int, float of a tensor)")
                dtype = args[0].dtype
                return False if dtype == torch.bool else (0.0 if dtype.is_floating_point or dtype.is_complex else 0)
            try:
                if real and tensors:  # the host's own real tensors: computed for real
                    with unset_fake_temporarily():
                        return func(*args, **kwargs)
                out = func(*args, **kwargs)  # faked (a factory: faked first, to see what it makes)
                if real and small_host_values(out):
                    with unset_fake_temporarily():
                        out = func(*args, **kwargs)
            except fake_errors as e:
                raise CaptureError(f"tensorpool.capture: {func} at {rec.where()} makes a tensor whose size depends on "
                                   "the values of its input, which a capture does not have (use a fixed-size "
                                   "alternative, or capture the step without it)") from e
            if on_gpu:
                for t in tree_leaves(out):
                    if isinstance(t, Tensor):
                        rec.see(t.untyped_storage(), t.device == gpu)
            return out

    def to_gpu(d):
        """d as the capture's device: "cuda" (any index) is the fake GPU."""
        if isinstance(d, torch.device):
            return gpu if d.type == "cuda" else d
        if isinstance(d, str) and d.startswith("cuda"):
            return gpu
        if isinstance(d, int) and not isinstance(d, bool):
            return gpu
        return d

    class Devices(TorchFunctionMode):
        """Above autograd: "cuda" wherever the program names a device becomes the fake GPU."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is Tensor.cuda:
                with rec.making(rec.kind or "inputs"):
                    return args[0].to(gpu, non_blocking=kwargs.get("non_blocking", False))
            if func is Tensor.to:
                parse = {k: v for k, v in kwargs.items() if k != "copy"}
                device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **parse)
                if device is not None and device.type == "cuda":
                    kw = {"dtype": dtype, "non_blocking": non_blocking, "copy": kwargs.get("copy", False)}
                    if memory_format is not None:
                        kw["memory_format"] = memory_format
                    with rec.making(rec.kind or ("inputs" if args[0].device != gpu else None)):
                        return args[0].to(gpu, **kw)
            if func is Tensor.pin_memory:
                return args[0]
            if func is Tensor.is_pinned:
                return False
            if func is Tensor.is_cuda.__get__:
                return args[0].device == gpu
            if "device" in kwargs:
                kwargs["device"] = to_gpu(kwargs["device"])
            return func(*args, **kwargs)

    return Outputs(), Devices()


def _apply_in_place(module, rec, fn, recurse=True, _moved=None):
    """nn.Module._apply for the capture. A fake parameter moved (to the fake GPU, to a dtype) takes
    the new tensor's data in place (`param.data = new`, as PyTorch does for plain tensors), since
    FakeTensorMode's weak references forbid the swap Module._apply makes for fake tensors; a real
    one (a small host tensor, made for real) is replaced by a new Parameter, as PyTorch does when
    the types differ. A parameter shared by several modules (tied weights) is moved once."""
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensor
    moved = {} if _moved is None else _moved
    if recurse:
        for child in module.children():
            _apply_in_place(child, rec, fn, True, moved)

    def apply(t):
        with torch.no_grad(), rec.making("weights"):
            return fn(t)

    for key, param in module._parameters.items():
        if param is None:
            continue
        if id(param) in moved:
            module._parameters[key] = moved[id(param)]
            continue
        new = apply(param)
        out = param
        if new is not param and isinstance(param, FakeTensor) and isinstance(new, FakeTensor):
            param.data = new
            param.fake_device = new.fake_device
        elif new is not param:
            out = torch.nn.Parameter(new, requires_grad=param.requires_grad)
            if param.grad is not None:
                out.grad = param.grad
            module._parameters[key] = out
        if out.grad is not None and out.grad.device != out.device:
            out.grad = apply(out.grad)
        moved[id(param)] = out
    for key, buf in module._buffers.items():
        if buf is not None:
            if id(buf) not in moved:
                moved[id(buf)] = apply(buf)
            module._buffers[key] = moved[id(buf)]
    return module


# --- CUDA autocast on the CPU -----------------------------------------------------------------

def _banned_binary_cross_entropy(*args, **kwargs):
    raise RuntimeError("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast "
                       "(CUDA autocast refuses them; use binary_cross_entropy_with_logits)")


def _autocast_library(rec):
    """A torch.library that replaces the CPU's autocast kernels by CUDA's policies (Python
    kernels at AutocastCPU) for every overload CUDA casts, and lets through every other overload
    the CPU would cast. Destroyed when the capture ends."""
    torch = _torch()
    from torch.library import Library, fallthrough_kernel

    key = torch._C.DispatchKey.AutocastCPU
    exclude = torch._C.DispatchKeySet(key)
    lib = Library("aten", "IMPL")
    cache = {}

    gpu = _gpu_device()

    def eligible(t):  # what CUDA autocast casts: floating-point GPU tensors but fp64
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 and t.device == gpu

    def cast(t, dtype):
        if isinstance(t, (list, tuple)):
            return type(t)(cast(x, dtype) for x in t)
        if not eligible(t) or t.dtype == dtype:
            return t
        lower = torch.get_autocast_dtype("cpu")
        cacheable = (dtype == lower and t.dtype == torch.float32 and t.requires_grad and t.is_leaf
                     and not t._is_view() and torch.is_autocast_cache_enabled())
        if not cacheable:
            return t.to(dtype)
        hit = cache.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        with rec.making("autocast"):
            out = t.to(dtype)
        cache[id(t)] = (weakref.ref(t), out)
        return out

    def widest(args, lower):
        to = lower
        for t in _tensors(args):
            if eligible(t) and t.dtype != torch.float64 and (t.dtype == torch.float32):
                to = torch.float32
        return to

    def _tensors(args):
        for a in args:
            if isinstance(a, (list, tuple)):
                yield from _tensors(a)
            elif isinstance(a, torch.Tensor):
                yield a

    def kernel(name, policy, op):
        dtype_index = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype" and not a.kwarg_only), None)
        target = getattr(getattr(torch.ops.aten, name.partition(".")[0]), _APPEND_TARGET[name]) \
            if policy == _APPEND_DTYPE else None

        def cast_all(args, kwargs, dtype):
            # Right to left: PyTorch's kernels cast each argument in a C++ call's argument list,
            # whose evaluation order GCC (PyTorch's Linux builds) makes right to left, so the last
            # argument's copy is made first (a bias before its weight before the input).
            cast_kwargs = {k: cast(v, dtype) for k, v in reversed(list(kwargs.items()))}
            args = [cast(a, dtype) for a in reversed(args)][::-1]
            return args, {k: cast_kwargs[k] for k in kwargs}

        def release_left_to_right(args, kwargs):
            # ... and destroys those copies in the reverse order: the first argument's first.
            for i in range(len(args)):
                args[i] = None
            for k in list(kwargs):
                del kwargs[k]

        def run(*args, **kwargs):
            with torch._C._ExcludeDispatchKeyGuard(exclude):
                lower = torch.get_autocast_dtype("cpu")
                if policy in (_LOWER, _FP32, _PROMOTE):
                    to = lower if policy == _LOWER else torch.float32 if policy == _FP32 else \
                        widest(list(args) + list(kwargs.values()), lower)
                    args, kwargs = cast_all(args, kwargs, to)
                    out = op(*args, **kwargs)
                    release_left_to_right(args, kwargs)
                    return out
                first = next(_tensors(args), None)
                if policy == _SET_OPT_DTYPE:
                    if first is None or not eligible(first):
                        return op(*args, **kwargs)
                    if dtype_index is not None:
                        args = list(args) + [None] * max(0, dtype_index + 1 - len(args))
                        if args[dtype_index] is None:
                            args[dtype_index] = torch.float32
                    elif kwargs.get("dtype") is None:
                        kwargs["dtype"] = torch.float32
                    return op(*args, **kwargs)
                out_type = torch.float32 if first is not None and eligible(first) else first.dtype
                return target(*args, dtype=out_type, **kwargs)
        return run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, policy in _CUDA_AUTOCAST.items():
            op = _overload(name)
            if op is None:
                continue
            lib.impl(name, kernel(name, policy, op), "AutocastCPU")
        lib.impl("binary_cross_entropy", _banned_binary_cross_entropy, "AutocastCPU")
        for n in torch._C._dispatch_get_all_op_names():
            if not n.startswith("aten::") or n[len("aten::"):] in _CUDA_AUTOCAST or n == "aten::binary_cross_entropy":
                continue
            if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCPU"):
                lib.impl(n[len("aten::"):], fallthrough_kernel, "AutocastCPU")
    return lib, cache


# --- torch.cuda, autocast and the optimizers as on a GPU ------------------------------------

class _Patches:
    """Attributes set for the capture and put back after it."""

    def __init__(self):
        self._saved = []
        self._undo = []

    def on_restore(self, fn):
        self._undo.append(fn)

    def set(self, owner, name, value):
        self._saved.append((owner, name, getattr(owner, name, _MISSING)))
        setattr(owner, name, value)

    def restore(self):
        while self._undo:
            self._undo.pop()()
        for owner, name, value in reversed(self._saved):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        self._saved.clear()


_MISSING = object()


class _DeviceProperties:
    def __init__(self, capacity):
        self.name = "tensorpool capture (no GPU)"
        self.total_memory = capacity
        self.major, self.minor = 9, 0
        self.multi_processor_count = 132


def _patch_cuda(p, rec, capacity):
    torch = _torch()
    cuda = torch.cuda

    @contextlib.contextmanager
    def stream(s):
        before = rec.stream
        rec.stream = 0 if s is None else s.stream_id
        try:
            yield s
        finally:
            rec.stream = before

    def synchronize(device=None):
        rec.sync()

    def reset_peak(device=None):
        rec.peak = rec.live

    values = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "set_device": lambda device: None, "get_device_name": lambda device=None: "tensorpool capture (no GPU)",
        "get_device_capability": lambda device=None: (9, 0), "is_bf16_supported": lambda *a, **k: True,
        "get_device_properties": lambda device=None: _DeviceProperties(capacity),
        "synchronize": synchronize, "empty_cache": rec.empty_cache,
        "memory_allocated": lambda device=None: rec.live, "max_memory_allocated": lambda device=None: rec.peak,
        "memory_reserved": lambda device=None: rec.live, "max_memory_reserved": lambda device=None: rec.peak,
        "reset_peak_memory_stats": reset_peak, "mem_get_info": lambda device=None: (max(0, capacity - rec.live), capacity),
        "Stream": _Stream, "Event": _Event, "stream": stream,
        "current_stream": lambda device=None: _Stream(stream_id=rec.stream),
        "default_stream": lambda device=None: _Stream(stream_id=0),
        "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None, "init": lambda: None,
        "_lazy_init": lambda: None, "is_initialized": lambda: True,
    }
    for name, value in values.items():
        p.set(cuda, name, value)
    p.set(torch.Tensor, "record_stream", lambda t, s: rec.record_stream(t, s))
    set_default_device = torch.set_default_device

    def set_default_device_on_gpu(device):
        is_cuda = (isinstance(device, str) and device.startswith("cuda")) or \
            (isinstance(device, torch.device) and device.type == "cuda")
        set_default_device(_gpu_device() if is_cuda else device)
    p.set(torch, "set_default_device", set_default_device_on_gpu)
    before = torch.get_default_device()
    p.on_restore(lambda: set_default_device(None if before == torch.device("cpu") else before))
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:  # torch.accelerator asks the CUDA runtime itself
        for name, value in {"current_stream": values["current_stream"], "current_device_index": lambda: 0,
                            "device_count": lambda: 1, "set_device_index": lambda device: None,
                            "synchronize": synchronize, "set_stream": lambda s: None}.items():
            if hasattr(accelerator, name):
                p.set(accelerator, name, value)


def _patch_autocast(p):
    torch = _torch()
    original = torch.amp.autocast_mode.autocast

    class autocast(original):  # noqa: N801 (PyTorch's name)
        """torch.autocast: "cuda" runs as CPU autocast with CUDA's rules (the capture's kernels) and
        CUDA's default dtype (float16)."""

        def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                device_type, dtype = "cpu", dtype if dtype is not None else torch.float16
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def cuda_amp_autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
        return autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def on_cpu(fn):
        def wrapped(device_type=None, *args):
            return fn("cpu" if device_type in (None, "cuda") else device_type, *args)
        return wrapped

    p.set(torch, "autocast", autocast)
    p.set(torch.amp, "autocast", autocast)
    p.set(torch.amp.autocast_mode, "autocast", autocast)
    p.set(torch.cuda.amp, "autocast", cuda_amp_autocast)
    p.set(torch, "is_autocast_enabled", on_cpu(torch.is_autocast_enabled))
    p.set(torch, "get_autocast_dtype", on_cpu(torch.get_autocast_dtype))


def _patch_data_loader(p):
    """DataLoaders load in this process: worker processes would run the dataset under the
    capture's modes and send fake tensors back, which cannot cross processes. What they load is
    host memory, which the capture does not record; pinning is host memory too."""
    import inspect
    from torch.utils.data import DataLoader
    original = DataLoader.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        given = bound.arguments
        if given.get("num_workers", 0) or given.get("pin_memory", False):
            warnings.warn("tensorpool.capture: the DataLoader loads in this process (num_workers=0, pin_memory off): "
                          "the device memory does not depend on it", stacklevel=2)
        given.update(num_workers=0, pin_memory=False, persistent_workers=False)
        if "prefetch_factor" in given:
            given["prefetch_factor"] = None
        original(*bound.args, **bound.kwargs)

    p.set(DataLoader, "__init__", init)


def _patch_optimizers(p, rec):
    """The optimizers pick foreach (or fused, when asked) as on a GPU: PyTorch's default is
    foreach for CUDA tensors and the for-loop for CPU ones."""
    torch = _torch()
    import torch.optim  # noqa: F401 (loads the optimizer modules)
    gpu = _gpu_device()

    def default_to_fused_or_foreach(params, differentiable, use_fused=False):
        if torch.jit.is_scripting() or differentiable:
            return False, False
        on_gpu = all(t is None or (t.device == gpu and torch.is_floating_point(t)) for t in params)
        fused = use_fused and on_gpu
        return fused, on_gpu and not fused

    for name, module in list(sys.modules.items()):
        if name.startswith("torch.optim") and hasattr(module, "_default_to_fused_or_foreach"):
            p.set(module, "_default_to_fused_or_foreach", default_to_fused_or_foreach)

    def params_of(optimizer):
        return [q for group in optimizer.param_groups for q in group["params"]]

    def before_step(optimizer, args, kwargs):
        params = params_of(optimizer)
        rec.mark(params, "weights")
        rec.mark([q.grad for q in params], "grads")
        rec.phase = "optimizer"

    def after_step(optimizer, args, kwargs):
        rec.phase = "forward"
        rec.mark([t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)],
                 "optimizer")
        rec.iteration()
        if rec.stop_after is not None and rec.steps >= rec.stop_after:
            raise _StopCapture()

    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    for handle in (register_optimizer_step_pre_hook(before_step), register_optimizer_step_post_hook(after_step)):
        p.on_restore(handle.remove)
    p.set(torch.nn.Module, "_apply", functools.partialmethod(_apply_in_place, rec))

    def backward(original):
        @functools.wraps(original)
        def run(*args, **kwargs):
            rec.backward_begins()
            rec.phase = "backward"
            try:
                return original(*args, **kwargs)
            finally:
                rec.phase = "forward"
        return run

    p.set(torch.autograd, "backward", backward(torch.autograd.backward))
    p.set(torch.autograd, "grad", backward(torch.autograd.grad))


# --- the capture ----------------------------------------------------------------------------

class CaptureResult:
    """What a capture recorded: `events` (op, addr, size, stream, label), `peak_bytes` (the most
    GPU bytes live at once), `allocations`, `steps` (optimizer steps seen), `out` (the file
    written, or None)."""

    def __init__(self, rec, out, source):
        self.events = rec.events
        self.peak_bytes = rec.peak
        self.live_bytes = rec.live
        self.allocations = rec.allocations
        self.steps = rec.steps
        self.out = out
        self.source = source

    def __repr__(self):
        return (f"CaptureResult({self.allocations} allocations, peak {self.peak_bytes} bytes, {self.steps} "
                f"optimizer steps, out={self.out!r})")


class Capture:
    """A context manager: what runs inside it is captured (see the module's doc).

        with tensorpool.capture.Capture(steps=2) as cap:
            main()
        cap.result.peak_bytes; cap.write("job.tptrace")

    `steps`: stop after that many optimizer steps (None: run to the end). `capacity`: the bytes
    torch.cuda.get_device_properties() and mem_get_info() report (default 80 GiB)."""

    def __init__(self, steps=None, capacity=80 << 30, source="tensorpool-capture"):
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise CaptureError(f"tensorpool.capture: steps must be a positive integer, not {steps!r}")
        self.steps, self.capacity, self.source = steps, capacity, source
        self.result = None

    def __enter__(self):
        torch = _torch()
        from torch._subclasses.fake_tensor import FakeTensorMode
        if _STATE:
            raise CaptureError("tensorpool.capture: a capture is already running")
        rec = self._rec = _Recorder()
        rec.stop_after = self.steps
        _Stream._next[0] = 1  # streams numbered from 1 in every capture: the same job, the same trace
        self._patches = _Patches()
        self._stack = contextlib.ExitStack()
        try:
            _patch_cuda(self._patches, rec, self.capacity)
            _patch_autocast(self._patches)
            _patch_optimizers(self._patches, rec)
            _patch_data_loader(self._patches)
            lib, self._cast_cache = _autocast_library(rec)
            self._stack.callback(lib._destroy)
            original_clear = torch.clear_autocast_cache

            def clear_autocast_cache():
                self._cast_cache.clear()
                original_clear()
            self._patches.set(torch, "clear_autocast_cache", clear_autocast_cache)
            outputs, devices = _modes(rec)
            self._stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
            self._stack.enter_context(outputs)
            self._stack.enter_context(devices)
        except BaseException:
            self._stack.close()
            self._patches.restore()
            raise
        _STATE.append(rec)
        return self

    def __exit__(self, kind, value, tb):
        rec = self._rec
        try:
            self._stack.close()
        finally:
            self._patches.restore()
            rec.active = False
            _STATE.pop()
            self._cast_cache.clear()
        rec.events = [(op, addr, size, stream, label.label() if isinstance(label, _Storage) else label)
                      for op, addr, size, stream, label in rec.events]
        self.result = CaptureResult(rec, None, self.source)
        return kind is _StopCapture  # the last step asked for: the job's loop ends here

    def write(self, out):
        """Writes the trace to `out` (.jsonl directly; .tptrace through the tensorpool CLI) and
        returns the path. Nothing is left half-written: the file appears complete or not at all."""
        if self.result is None:
            raise CaptureError("tensorpool.capture: write() after the capture ends")
        write_trace(self.result, out)
        self.result.out = out
        return out


def _jsonl_lines(result):
    head = {"format": "tensorpool-trace", "version": 3, "source": result.source,
            "metadata": [f"capture=steps:{result.steps},allocations:{result.allocations},peak:{result.peak_bytes}",
                         f"torch={_torch().__version__}"]}
    yield json.dumps(head)
    for tick, (op, addr, size, stream, label) in enumerate(result.events):
        e = {"op": op, "device": 0, "stream": stream, "addr": hex(addr), "size": size, "time_us": tick}
        if label:
            e["label"] = label
        yield json.dumps(e)


def write_trace(result, out):
    """Writes a CaptureResult as `out`: .jsonl, else .tptrace (converted by the tensorpool CLI)."""
    out = os.fspath(out)
    directory = os.path.dirname(os.path.abspath(out))
    if not out.endswith((".jsonl", ".tptrace")):
        raise CaptureError(f"tensorpool.capture: {out}: the trace's name must end in .tptrace or .jsonl")
    fd, tmp = tempfile.mkstemp(suffix=".jsonl", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            for line in _jsonl_lines(result):
                f.write(line + "\n")
        if out.endswith(".jsonl"):
            os.replace(tmp, out)
            return
        from tensorpool._cli import executable
        import subprocess
        binary = tmp[:-len(".jsonl")] + ".tptrace"
        try:
            done = subprocess.run([executable(), "convert", tmp, binary], capture_output=True, text=True)
            if done.returncode != 0:
                raise CaptureError(f"tensorpool.capture: converting the trace to {out} failed: {done.stderr.strip()}")
            os.replace(binary, out)
        finally:
            if os.path.exists(binary):
                os.unlink(binary)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class ScriptError(CaptureError):
    """The captured program raised: `error` is its exception (with its traceback); no trace was
    written."""

    def __init__(self, message, error):
        super().__init__(message)
        self.error = error


def _raised(what, e):
    frames = traceback.extract_tb(e.__traceback__)
    skipped = _skipped_dirs()
    mine = [f for f in frames if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(skipped)]
    where = f" at {mine[-1].filename}:{mine[-1].lineno}" if mine else ""
    return ScriptError(f"tensorpool.capture: {what} raised {type(e).__name__}: {e}{where}; no trace written", e)


def _check_steps(result, steps, what):
    if steps is not None and result.steps < steps:
        warnings.warn(f"tensorpool.capture: {what} ended after {result.steps} optimizer steps of the {steps} asked "
                      "for: it never reached optimizer.step() that often (capture a program without an optimizer "
                      "with steps=None, --steps 0)", stacklevel=3)


def _captured(call, what, source, out, steps, capacity):
    """Runs call() captured: the CaptureResult, the trace written to `out` when given. What the
    program raises is a ScriptError naming `what` (nothing written); a warning when it ends before
    `steps` optimizer steps."""
    with Capture(steps=steps, capacity=capacity, source=f"tensorpool-capture:{source}") as cap:
        try:
            call()
        except CaptureError:
            raise
        except Exception as e:
            raise _raised(what, e) from e
    _check_steps(cap.result, steps, what)
    if out is not None:
        cap.write(out)
    return cap.result


def run(fn, *args, out=None, steps=None, capacity=80 << 30, **kwargs):
    """Runs fn(*args, **kwargs) captured (model, data and loop all inside fn) and returns a
    CaptureResult; writes the trace to `out` when given. ScriptError when fn raises (nothing is
    written); a warning when it ends before `steps` optimizer steps."""
    name = getattr(fn, "__qualname__", repr(fn))
    return _captured(lambda: fn(*args, **kwargs), name, name, out, steps, capacity)


def run_script(script, argv=(), out=None, steps=None, capacity=80 << 30):
    """Runs a Python script as __main__ (sys.argv = [script, *argv]) captured; see run(). A script
    that exits with a status other than 0 is a CaptureError too."""
    if not os.path.isfile(script):
        raise CaptureError(f"tensorpool.capture: {script}: no such script")

    def call():
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                raise CaptureError(f"tensorpool.capture: {script} exited with status {e.code}; no trace "
                                   "written") from e

    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        return _captured(call, script, os.path.basename(script), out, steps, capacity)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tensorpool.capture",
        description="Runs a PyTorch training script on the CPU with fake tensors and writes the trace of the GPU "
                    "memory it would allocate (no GPU needed): for tensorpool fit, plan, compare, info and report.")
    parser.add_argument("--out", "-o", required=True, help="the trace to write: .tptrace or .jsonl")
    parser.add_argument("--steps", type=int, default=2,
                        help="stop after this many optimizer steps (default 2: the first makes the optimizer's states; "
                             "0: run the script to its end)")
    parser.add_argument("--capacity", default="80GiB",
                        help="the device memory torch.cuda reports to the script (default 80GiB)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    a = parser.parse_args(argv)
    if a.steps < 0:
        parser.error("--steps must be 0 or more")
    try:
        capacity = _parse_bytes(a.capacity)
        result = run_script(a.script, a.args, out=a.out, steps=a.steps or None, capacity=capacity)
    except ScriptError as e:
        traceback.print_exception(type(e.error), e.error, e.error.__traceback__, file=sys.stderr)
        print(e, file=sys.stderr)
        return 1
    except CaptureError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"wrote {a.out}: {result.allocations} GPU allocations, peak {result.peak_bytes / (1 << 30):.3f} GiB "
          f"live, {result.steps} optimizer steps", file=sys.stderr)
    return 0


def _parse_bytes(text):
    units = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
             "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
    number = text.rstrip("KMGTiB")
    unit = text[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = None
    if value is None or unit not in units or value <= 0:
        raise CaptureError(f"tensorpool.capture: --capacity {text!r}: expected a size such as 80GiB or 24GB")
    return int(value * units[unit])


if __name__ == "__main__":
    sys.exit(main())
