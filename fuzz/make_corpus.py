#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets that python can produce (checked in; rerun only
to change them): fuzz/corpus/{pickle,pytorch_snapshot,rmm_log,config}/. The native-trace seeds
(fuzz/corpus/trace/) come from the project's own writers: build-asan/fuzz/fuzz_make_trace_seeds.

Usage: make_corpus.py [CORPUS_DIR]   (default: the corpus/ directory next to this script)
Every seed is small (the fuzzer mutates them; a few KiB per target in all).
"""
import os
import pickle
import sys

MIB = 1 << 20


def write(directory, name, data):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# --- pickle: every kind of plain data, every protocol, and refused opcodes ---------------------

def plain():
    shared = [1, 2]
    return {"none": None, "t": True, "f": False,
            "ints": [0, 255, 256, 65536, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 2**64 - 1],
            "floats": [0.0, -1.5, 1e300, float("inf")], "s": ["", "h\u00e9llo", "x" * 40],
            "b": b"\x00\xff", "t3": (1, 2, 3), "t5": (1, 2, 3, 4, 5), "nested": {"a": [1, (2, [3])]},
            "shared": [shared, shared], "empty": [[], {}, ()]}


def pickle_seeds(out):
    for protocol in (2, 3, 4, 5):
        write(out, "plain_p%d" % protocol, pickle.dumps(plain(), protocol=protocol))
    write(out, "bytearray_p5", pickle.dumps(bytearray(b"abc"), protocol=5))
    write(out, "memo_long_p4", pickle.dumps([["k%d" % i for i in range(300)], "k299"], protocol=4))
    write(out, "refused_global_p2", pickle.dumps(b"ab", protocol=2))
    write(out, "refused_set_p4", pickle.dumps({1, 2}, protocol=4))
    write(out, "bigint_p4", pickle.dumps([2**64], protocol=4))
    write(out, "proto0", pickle.dumps([1, "a", None], protocol=0))


# --- PyTorch snapshots ---------------------------------------------------------------------------

PY = {"name": "forward", "filename": "/m.py", "line": 42}
CPP = {"name": "torch::unwind::unwind()", "filename": "??", "line": 0}


def block(address, size, state, requested=None):
    return {"address": address, "size": size, "requested_size": size if requested is None else requested,
            "state": state, "frames": [PY]}


def segment(device, address, blocks, segment_type="large", expandable=False):
    live = [b for b in blocks if b["state"].startswith("active")]
    return {"device": device, "address": address, "total_size": sum(b["size"] for b in blocks),
            "allocated_size": sum(b["size"] for b in live), "active_size": sum(b["size"] for b in live),
            "requested_size": sum(b["requested_size"] for b in live), "stream": 0,
            "segment_type": segment_type, "is_expandable": expandable, "blocks": blocks}


def ev(action, addr, size, t=None, stream=0):
    e = {"action": action, "addr": addr, "size": size, "stream": stream, "frames": [CPP, PY]}
    if t is not None:
        e["time_us"] = t
    return e


def snapshot_seeds(out):
    a, b = 0x7F0000000000, 0x7F0001000000
    window = {
        "segments": [segment(0, a, [block(a, 2 * MIB, "active_allocated", 2000000),
                                    block(a + 2 * MIB, 2 * MIB, "inactive"),
                                    block(a + 4 * MIB, MIB, "active_pending_free", 1000000)]),
                     segment(0, b, [block(b, 512, "active_allocated", 500),
                                    block(b + 512, 2 * MIB - 512, "inactive")], "small")],
        "device_traces": [[ev("free_requested", a + 2 * MIB, 2000000, 1), ev("free_completed", a + 2 * MIB, 2000000, 2),
                           ev("segment_alloc", b, 2 * MIB, 3), ev("alloc", b, 500, 4), ev("alloc", a, 2000000, 5),
                           ev("segment_free", 0x7F0005000000, 2 * MIB, 6), {"action": "oom", "size": 1 << 40},
                           ev("snapshot", 0, 0, 8)]],
        "allocator_settings": {"max_split_size": 134217728, "roundup_power2_divisions": {"1": 0}},
    }
    write(out, "window_p4", pickle.dumps(window, protocol=4))
    write(out, "window_p2", pickle.dumps(window, protocol=2))
    r = 0x7E0000000000
    expandable = {"segments": [segment(0, r, [block(r, 20 * MIB, "active_allocated"),
                                              block(r + 20 * MIB, 20 * MIB, "inactive")], expandable=True)],
                  "device_traces": [[ev("segment_map", r + 20 * MIB, 20 * MIB, 1), ev("alloc", r + 20 * MIB, 20 * MIB, 2),
                                     ev("segment_unmap", r + 60 * MIB, 20 * MIB, 3)]]}
    write(out, "expandable_p4", pickle.dumps(expandable, protocol=4))
    old = {"segments": [{"device": 0, "address": a, "total_size": 4 * MIB, "allocated_size": 0, "active_size": 0,
                         "requested_size": 0, "stream": 0, "segment_type": "large",
                         "blocks": [{"size": 4 * MIB, "requested_size": 4000000, "state": "active_allocated",
                                     "history": [{"addr": 0, "real_size": 4000000, "frames": [PY]}]}]}],
           "device_traces": [[], [ev("alloc", 0x1000, 7, stream=7)]]}
    write(out, "state_only_two_devices_p4", pickle.dumps(old, protocol=4))
    write(out, "bare_segments_p4", pickle.dumps([segment(1, 0x300000, [block(0x300000, 2 * MIB, "active_allocated", 7)],
                                                         "small")], protocol=4))


# --- RMM logs --------------------------------------------------------------------------------------

def rmm_seeds(out):
    header = "Thread,Time,Action,Pointer,Size,Stream"
    lines = [header,
             "140573312345856,23:59:59.999000,allocate,0x7f8a40000000,1024,0",
             "140573312345857,23:59:59.999500,free,0x7f8a3f000000,4096,0x55d0c3a1e2f0",
             "140573312345856,00:00:00.000250,allocate failure,(nil),1099511627776,0",
             "140573312345856,00:00:00.000300,free,0x7f8a40000000,1024,0"]
    write(out, "midnight_crlf.csv", "\r\n".join(lines) + "\r\n")
    write(out, "colon_us.csv", "\n".join([header, "1,18:19:50:427419,allocate,0x10,256,0",
                                          "1,18:19:50:427420,deallocate,0x10,256,0"]) + "\n")
    write(out, "epoch.csv", "\n".join([header, "7,1634567890.123456,allocate,0x7f0000001000,8,0x1",
                                       "7,1634567890.123500,free,0x7f0000001000,8,0x1", ""]))
    write(out, "header_only.csv", header + "\n")


# --- config strings ----------------------------------------------------------------------------------

def config_seeds(out):
    seeds = {
        "all_keys": "memory_limit:40GiB,max_split_size:256MiB,oversize_slack:20MiB,small_size:1MiB,"
                    "small_segment_size:2MiB,large_segment_size:20MiB,min_split_remainder:512,"
                    "cross_stream_reuse:true,mode:fixed,vmm_reserve:0,vmm_max_growth:256MiB,vmm_growth_divisor:64,vmm_max_chunk:1GiB,vmm_idle_divisor:8",
        "fraction": "memory_limit:0.9",
        "vmm": " mode : vmm , vmm_reserve:1.5GiB,vmm_max_growth:64M",
        "decimal_units": "memory_limit:20GB,large_segment_size:20MB,oversize_slack:1KB",
        "none": "max_split_size:none,memory_limit:none,cross_stream_reuse:off",
        "bad_value": "small_size:12x",
        "empty_items": ",,memory_limit:1TiB,",
    }
    for name, text in seeds.items():
        write(out, name, text)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    pickle_seeds(os.path.join(root, "pickle"))
    snapshot_seeds(os.path.join(root, "pytorch_snapshot"))
    rmm_seeds(os.path.join(root, "rmm_log"))
    config_seeds(os.path.join(root, "config"))


if __name__ == "__main__":
    main()
