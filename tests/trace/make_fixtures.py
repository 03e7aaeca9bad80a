#!/usr/bin/env python3
"""Generates the fixtures of tensorpool_test_importers (run by CMake at build time).

Usage: make_fixtures.py OUTPUT_DIR

Writes, into OUTPUT_DIR:
  plain_p{2,3,4,5}.pickle  one value holding every kind of plain data, per protocol (the C++ test
                           checks it value by value: keep plain_value() and test_pickle.cpp in step)
  refused.txt              "file|offset|expected text" lines for pickles Python writes that the
                           reader must refuse (objects, sets, ints beyond 64 bits, recursion)
  snap_*.pickle            synthetic PyTorch snapshots (checked event by event in
                           test_pytorch_snapshot.cpp; snap_empty_cache in test_empty_cache.cpp)
                           and not-a-snapshot pickles
  rmm_crlf.csv             an RMM log with CRLF line ends and a trailing newline
  fixtures.stamp           written last
"""
import collections
import os
import pickle
import pickletools
import sys

MIB = 1 << 20

# ------------------------------------------------------------------------------------------------
# Plain values


def plain_value(protocol):
    shared_list = [1, 2]
    shared = {"k": shared_list}
    shared_str = "".join(["shared-", "string"])  # one object, memoized once
    keys = ["k%d" % i for i in range(1001)]
    value = {
        "none": None,
        "true": True,
        "false": False,
        "ints": [0, 1, 255, 256, 65535, 65536, -1, -256, 2**31 - 1, -(2**31), 2**31,
                 -(2**31) - 1, 2**62, -(2**62), 2**63 - 1, -(2**63)],
        "uints": [2**63, 2**64 - 1],
        "floats": [0.0, -1.5, 1e300, 5e-324, float("inf"), float("-inf")],
        "strings": ["", "ascii", "h\u00e9llo w\u00f6rld \u2713", "\U0001F600", "x" * 300],
        "empty": [[], {}, (), ""],
        "tuples": [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4, 5)],
        "nested": {"a": [1, (2, [3, {"b": None}])]},
        "shared": [shared, shared, shared_list],
        "shared_str": [shared_str, shared_str],
        "one": {"only": [42]},
        "long_list": list(range(2500)),
        "long_dict": {k: i for i, k in enumerate(keys)},
        "again": [keys[500], keys[1000]],  # memo indices above 255: LONG_BINGET
    }
    if protocol >= 3:
        value["bytes"] = [b"", b"\x00\xff", b"y" * 300]
    if protocol >= 5:
        value["bytearray"] = bytearray(b"abc")
    return value


# Every opcode Python emits for plain data of this size; the fixtures must use them all.
EXPECTED_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1",
    "BININT2", "LONG1", "BINFLOAT", "SHORT_BINUNICODE", "BINUNICODE", "SHORT_BINBYTES",
    "BINBYTES", "BYTEARRAY8", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3", "TUPLE", "APPEND", "APPENDS", "SETITEM", "SETITEMS", "BINPUT", "LONG_BINPUT",
    "MEMOIZE", "BINGET", "LONG_BINGET",
}


def write(out, name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


def write_plain(out):
    used = set()
    for protocol in (2, 3, 4, 5):
        data = pickle.dumps(plain_value(protocol), protocol=protocol)
        used |= {op.name for op, _, _ in pickletools.genops(data)}
        write(out, "plain_p%d.pickle" % protocol, data)
    missing = EXPECTED_OPCODES - used
    if missing:
        sys.exit("make_fixtures.py: the plain fixtures do not use %s" % sorted(missing))


def first_offset(data, opname):
    for op, _, pos in pickletools.genops(data):
        if op.name == opname:
            return pos
    sys.exit("make_fixtures.py: no %s in a refused fixture" % opname)


def write_refused(out):
    recursive = []
    recursive.append(recursive)
    cases = [
        ("refused_bytes_p2.pickle", pickle.dumps(b"ab", protocol=2), "GLOBAL", "forbidden opcode GLOBAL"),
        ("refused_object_p4.pickle", pickle.dumps(collections.OrderedDict(a=1), protocol=4),
         "STACK_GLOBAL", "forbidden opcode STACK_GLOBAL"),
        ("refused_set_p4.pickle", pickle.dumps({1, 2}, protocol=4), "EMPTY_SET", "unsupported opcode EMPTY_SET"),
        ("refused_frozenset_p4.pickle", pickle.dumps(frozenset([1]), protocol=4), "FROZENSET",
         "unsupported opcode FROZENSET"),
        ("refused_bigint_p4.pickle", pickle.dumps([2**64], protocol=4), "LONG1", "int does not fit in 64 bits"),
        ("refused_negbigint_p3.pickle", pickle.dumps(-(2**63) - 1, protocol=3), "LONG1",
         "int does not fit in 64 bits"),
        ("refused_hugeint_p4.pickle", pickle.dumps(2**2100, protocol=4), "LONG4", "int does not fit in 64 bits"),
        ("refused_recursive_p4.pickle", pickle.dumps(recursive, protocol=4), "APPEND", "already referenced"),
    ]
    lines = []
    for name, data, opname, text in cases:
        write(out, name, data)
        lines.append("%s|%d|%s" % (name, first_offset(data, opname), text))
    with open(os.path.join(out, "refused.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------------
# Synthetic snapshots (the expected conversions are spelled out in test_pytorch_snapshot.cpp)

PY_FRAME_1 = {"name": "step", "filename": "/src/train.py", "line": 10}
PY_FRAME_2 = {"name": "forward", "filename": "/src/model.py", "line": 42}
CPP_FRAME = {"name": "torch::unwind::unwind()", "filename": "??", "line": 0}
NO_FILENAME = {"name": "f", "line": 1}
# A backward-pass stack (no Python frame), innermost first, as PyTorch records it.
CPP_BACKWARD = [CPP_FRAME, {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)", "filename": "CUDACachingAllocator.cpp", "line": 0},
                {"name": "at::_ops::div_Tensor::call(at::Tensor const&, at::Tensor const&)", "filename": "??", "line": 0},
                {"name": "torch::autograd::generated::MeanBackward0_apply_functional(std::vector<at::Tensor>)", "filename": "Functions.cpp", "line": 0},
                {"name": "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "filename": "??", "line": 0}]
CPP_OP = [CPP_FRAME, {"name": "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)", "filename": "??", "line": 0}]


def block(address, size, state, requested=None, frames=None):
    b = {"address": address, "size": size, "requested_size": size if requested is None else requested,
         "state": state, "frames": frames or []}
    return b


def segment(device, address, blocks, segment_type="large", expandable=False, stream=0, pool=(0, 0)):
    total = sum(b["size"] for b in blocks)
    live = [b for b in blocks if b["state"].startswith("active")]
    return {"device": device, "address": address, "total_size": total,
            "allocated_size": sum(b["size"] for b in live), "active_size": sum(b["size"] for b in live),
            "requested_size": sum(b["requested_size"] for b in live), "stream": stream,
            "segment_type": segment_type, "segment_pool_id": pool, "is_expandable": expandable,
            "frames": [], "blocks": blocks}


def event(action, addr, size, time_us=None, frames=None, stream=0):
    e = {"action": action, "addr": addr, "size": size, "stream": stream}
    if time_us is not None:
        e["time_us"] = time_us
    if frames is not None:
        e["frames"] = frames
    return e


def settings(**extra):
    s = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "max_split_size": 134217728,
         "garbage_collection_threshold": 0.0, "expandable_segments": False,
         "roundup_power2_divisions": {"1": 0, "2": 4}}
    s.update(extra)
    return s


def snap_mid_window():
    A, B, D, E = 0x7F0000000000, 0x7F0001000000, 0x7F0002000000, 0x7F0003000000
    seg_a = segment(0, A, [
        block(A, 2 * MIB, "active_allocated", 2000000),                    # allocated in the window
        block(A + 2 * MIB, 4 * MIB, "active_allocated", 4000000, [PY_FRAME_1]),  # untouched: seed
        block(A + 6 * MIB, 2 * MIB, "inactive"),                           # freed in the window: seed
        block(A + 8 * MIB, 1 * MIB, "active_pending_free", 1000000),       # untouched: seed
        block(A + 9 * MIB, 11 * MIB, "inactive"),                          # free_completed only: seed
    ])
    seg_b = segment(0, B, [block(B, 512, "active_allocated", 500), block(B + 512, 2 * MIB - 512, "inactive")],
                    segment_type="small")
    events = [
        event("free_requested", A + 6 * MIB, 2000000, 1000, [PY_FRAME_1]),
        event("free_completed", A + 6 * MIB, 2000000, 1001, [PY_FRAME_1]),
        event("segment_free", D, 20 * MIB, 1002),
        event("segment_alloc", B, 2 * MIB, 1003),
        event("alloc", B, 500, 1004),
        event("alloc", A, 2000000, 1005, [CPP_FRAME, PY_FRAME_2]),
        event("snapshot", 0, 0, 1006),
        event("segment_free", E, 2 * MIB, 1007),
        {"action": "oom", "size": 1 << 40, "stream": 0, "device_free": 123},  # no addr, no time
        event("free_completed", A + 9 * MIB, 1000, 1009),
    ]
    return {"segments": [seg_a, seg_b], "device_traces": [events], "allocator_settings": settings(),
            "external_annotations": []}


def snap_multi_device():
    S0, S1, S3 = 0x100000000, 0x200000000, 0x400000000
    segments = [
        segment(1, S1, [block(S1, 20 * MIB, "active_allocated", 20 * MIB)]),
        segment(0, S0, [block(S0, 4 * MIB, "inactive"), block(S0 + 4 * MIB, 16 * MIB, "inactive")]),
        segment(3, S3, [block(S3, 2 * MIB, "active_allocated", 100)], segment_type="small"),
    ]
    dev0 = [event("segment_alloc", S0, 20 * MIB, 10), event("alloc", S0, 4 * MIB, 11),
            event("free_requested", S0, 4 * MIB, 12), event("free_completed", S0, 4 * MIB, 13)]
    dev1 = [event("free_requested", S1, 20 * MIB, 20, stream=7), event("free_completed", S1, 20 * MIB, 21, stream=7),
            event("alloc", S1, 20 * MIB, 22, stream=7)]
    return {"segments": segments, "device_traces": [dev0, dev1, []], "allocator_settings": settings()}


def snap_expandable():
    R, S = 0x7E0000000000, 0x7E1000000000
    seg_r = segment(0, R, [block(R, 20 * MIB, "active_allocated"), block(R + 20 * MIB, 20 * MIB, "active_allocated"),
                           block(R + 40 * MIB, 20 * MIB, "inactive")], expandable=True)
    seg_s = segment(0, S, [block(S, 512, "active_allocated"), block(S + 512, 4 * MIB - 512, "inactive")],
                    segment_type="small", expandable=True)
    events = [
        event("segment_map", R + 20 * MIB, 20 * MIB, 1),
        event("alloc", R + 20 * MIB, 20 * MIB, 2),
        event("segment_unmap", R + 60 * MIB, 40 * MIB, 3),
        event("segment_map", R + 100 * MIB, 20 * MIB, 4),
        event("segment_unmap", R + 100 * MIB, 20 * MIB, 5),
        event("segment_map", S + 2 * MIB, 2 * MIB, 6),
    ]
    return {"segments": [seg_r, seg_s], "device_traces": [events],
            "allocator_settings": settings(expandable_segments=True)}


def snap_private_pool():
    # A CUDA graph's private pool (segment_pool_id (1, 0)) beside the default pool: allocations in
    # its segments are imported under its tag.
    D, G = 0x7C0000000000, 0x7C0001000000
    seg_d = segment(0, D, [block(D, 2 * MIB, "active_allocated", 2000000), block(D + 2 * MIB, 1 * MIB, "active_allocated"),
                           block(D + 3 * MIB, 17 * MIB, "inactive")])
    seg_g = segment(0, G, [block(G, 4 * MIB, "active_allocated", 4000000), block(G + 4 * MIB, 2 * MIB, "active_allocated"),
                           block(G + 6 * MIB, 14 * MIB, "inactive")], pool=(1, 0))
    events = [event("alloc", D, 2000000, 1, [PY_FRAME_1]), event("alloc", G, 4000000, 2, [PY_FRAME_2])]
    return {"segments": [seg_d, seg_g], "device_traces": [events], "allocator_settings": settings()}


def snap_state_only():
    # The format of PyTorch 2.0: no block addresses, a "history" per block, no settings.
    X, Y = 0x7D0000000000, 0x7D0001000000

    def old_block(size, state, requested):
        return {"size": size, "requested_size": requested, "state": state,
                "history": [{"addr": 0, "real_size": requested, "frames": [PY_FRAME_2]}]}

    def old_segment(address, segment_type, blocks):
        return {"device": 0, "address": address, "total_size": sum(b["size"] for b in blocks),
                "allocated_size": 0, "active_size": 0, "requested_size": 0, "stream": 0,
                "segment_type": segment_type, "blocks": blocks}

    segments = [
        old_segment(X, "large", [old_block(4 * MIB, "active_allocated", 4000000), old_block(6 * MIB, "inactive", 0),
                                 old_block(10 * MIB, "active_pending_free", 9000000)]),
        old_segment(Y, "small", [old_block(512, "active_allocated", 512), old_block(2 * MIB - 512, "inactive", 0)]),
    ]
    stray = [{"action": "free_completed", "addr": X + 4 * MIB, "size": 100, "stream": 0}]
    return {"segments": segments, "device_traces": [stray]}


def snap_shared_stacks():
    """Stacks and frames shared by several events, as PyTorch pickles them (one object, memo
    references): the same list for events 0 and 2 (and 1 and 3), CPP_FRAME in every stack."""
    python_stack = [CPP_FRAME, PY_FRAME_1]
    return {"segments": [], "device_traces": [[
        event("alloc", 0x1000, 512, 1, python_stack), event("alloc", 0x2000, 512, 2, CPP_OP),
        event("alloc", 0x3000, 512, 3, python_stack), event("alloc", 0x4000, 512, 4, CPP_OP),
        event("alloc", 0x5000, 512, 5, [CPP_FRAME])]]}


def not_snapshots():
    good = segment(0, 0x1000, [block(0x1000, 4096, "inactive")])
    bad = segment(0, 0x9000, [block(0x9000, 4096, "inactive")])
    bad["blocks"][0]["size"] = "4096"
    missing = dict(good)
    del missing["segment_type"]
    pool_int, pool_three = dict(good), dict(good)
    pool_int["segment_pool_id"], pool_three["segment_pool_id"] = 5, (1, 2, 3)
    return {
        "snap_bad_pool_int.pickle": {"segments": [pool_int], "device_traces": []},
        "snap_bad_pool_three.pickle": {"segments": [good, pool_three], "device_traces": []},
        "snap_bad_block_size.pickle": {"segments": [good, good, good, bad], "device_traces": []},
        "snap_missing_key.pickle": {"segments": [missing], "device_traces": []},
        "snap_root_int.pickle": 42,
        "snap_bad_action.pickle": {"segments": [], "device_traces": [[event("teleport", 1, 2)]]},
        # A frame without a filename, shared by the stacks of events 1 and 2.
        "snap_shared_bad_frame.pickle": {"segments": [], "device_traces": [[
            event("alloc", 0x1000, 512, 1, [PY_FRAME_1]), event("alloc", 0x2000, 512, 2, [NO_FILENAME, PY_FRAME_2]),
            event("alloc", 0x3000, 512, 3, [NO_FILENAME])]]},
        "snap_inconsistent.pickle": {"segments": [], "device_traces": [[event("alloc", 5, 5),
                                                                        event("segment_alloc", 0x5000, 2 * MIB)]]},
    }


def snap_empty_cache():
    """Segments freed by an empty_cache() call (run 1), and by the out-of-memory path (run 2)."""
    K, A, S, C, G = 0x7F1000000000, 0x7F1001000000, 0x7F1002000000, 0x7F1003000000, 0x7F1004000000
    seg_k = segment(0, K, [block(K, 4 * MIB, "active_allocated"), block(K + 4 * MIB, 2 * MIB, "active_allocated"),
                           block(K + 6 * MIB, 14 * MIB, "inactive")])
    seg_c = segment(0, C, [block(C, 16 * MIB, "active_allocated")])
    events = [
        event("segment_alloc", K, 20 * MIB, 1), event("alloc", K, 4 * MIB, 2),
        event("segment_alloc", A, 20 * MIB, 3, stream=1), event("alloc", A, 4 * MIB, 4, stream=1),
        event("free_requested", A, 4 * MIB, 5, stream=1), event("free_completed", A, 4 * MIB, 6, stream=1),
        event("segment_alloc", S, 2 * MIB, 7), event("alloc", S, 1000, 8),
        event("free_requested", S, 1000, 9), event("free_completed", S, 1000, 10),
        event("segment_free", A, 20 * MIB, 11, stream=1), event("segment_free", S, 2 * MIB, 12),  # empty_cache()
        event("alloc", K + 4 * MIB, 2 * MIB, 13),
        event("segment_alloc", C, 16 * MIB, 14), event("alloc", C, 16 * MIB, 15),
        event("segment_alloc", G, 40 * MIB, 16), event("alloc", G, 40 * MIB, 17),
        event("free_requested", G, 40 * MIB, 18), event("free_completed", G, 40 * MIB, 19),
        event("segment_free", G, 40 * MIB, 20),  # released by a failed 100 GiB request, then:
        {"action": "oom", "size": 100 << 30, "stream": 0, "time_us": 21},
    ]
    return {"segments": [seg_k, seg_c], "device_traces": [events], "allocator_settings": settings(),
            "external_annotations": []}


def write_snapshots(out):
    snaps = {
        "snap_empty_cache.pickle": snap_empty_cache(),
        "snap_mid_window.pickle": snap_mid_window(),
        "snap_multi_device.pickle": snap_multi_device(),
        "snap_expandable.pickle": snap_expandable(),
        "snap_state_only.pickle": snap_state_only(),
        "snap_private_pool.pickle": snap_private_pool(),
        "snap_cpp_stacks.pickle": {"segments": [], "device_traces": [[
            event("alloc", 0x1000, 512, 1, CPP_BACKWARD), event("alloc", 0x2000, 512, 2, CPP_OP),
            event("alloc", 0x3000, 512, 3, [CPP_FRAME])]]},
        "snap_shared_stacks.pickle": snap_shared_stacks(),
    }
    # torch.cuda.memory_snapshot() returns the bare list of segments.
    snaps["snap_bare_segments.pickle"] = [segment(0, 0x300000, [block(0x300000, 2 * MIB, "active_allocated", 7)],
                                                  segment_type="small")]
    snaps.update(not_snapshots())
    for name, value in snaps.items():
        write(out, name, pickle.dumps(value, protocol=4))


# ------------------------------------------------------------------------------------------------
# RMM


def write_rmm(out):
    lines = [
        "Thread,Time,Action,Pointer,Size,Stream",
        "140573312345856,23:59:59.999000,allocate,0x7f8a40000000,1024,0",
        "140573312345857,23:59:59.999500,free,0x7f8a3f000000,4096,0x55d0c3a1e2f0",
        "140573312345856,00:00:00.000250,allocate failure,(nil),1099511627776,0",
        "140573312345856,00:00:00.000300,free,0x7f8a40000000,1024,0",
    ]
    write(out, "rmm_crlf.csv", ("\r\n".join(lines) + "\r\n").encode())


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    write_plain(out)
    write_refused(out)
    write_snapshots(out)
    write_rmm(out)
    with open(os.path.join(out, "fixtures.stamp"), "w") as f:
        f.write("ok\n")


if __name__ == "__main__":
    main()
