#!/usr/bin/env python3
"""The progress bar (tools/progress.hpp) through a pseudo-terminal: it appears on stderr when
stderr is a terminal and finishes at 100%; piped, with --quiet or with --json there is none, and
stdout stays clean. Usage: progress_test.py TENSORPOOL_BINARY"""
import json
import os
import pty
import subprocess
import sys
import tempfile
import threading

from checks import check, finish

binary = sys.argv[1]


def on_tty(args):
    """Runs args with stderr on a pseudo-terminal, stdout on a pipe: (status, stdout, what the
    terminal got)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    # stdout is drained beside the terminal: a child whose output outgrows the pipe's buffer
    # would otherwise wait on it while this waits on the terminal.
    stdout = []
    reader = threading.Thread(target=lambda: stdout.append(p.stdout.read()))
    reader.start()
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    reader.join()
    out = stdout[0]
    p.wait()
    os.close(master)
    return p.returncode, out.decode(), seen.decode(errors="replace")


def piped(args):
    p = subprocess.run(args, capture_output=True, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def bar_frames(text):
    return [f for f in text.split("\r") if "%" in f and "[" in f]


with tempfile.TemporaryDirectory() as work:
    small = os.path.join(work, "small.tptrace")
    big = os.path.join(work, "big.tptrace")
    subprocess.run([binary, "generate", small, "--options", "layers:2,hidden:256,ffn:1024,vocab:1000,micro_batch:4,seq:2048,seq_dist:uniform,steps:3"],
                   check=True, capture_output=True)
    # 8 allocators x ~140k events: above the 1M events from which compare draws a bar.
    subprocess.run([binary, "generate", big, "--options", "layers:2,hidden:256,ffn:1024,vocab:1000,micro_batch:4,seq:2048,seq_dist:uniform,steps:525"],
                   check=True, capture_output=True)
    report = [binary, "report", small, "-o", os.path.join(work, "r.html")]

    status, out, tty = on_tty(report)
    frames = bar_frames(tty)
    check("report on a terminal exits 0", status == 0, tty)
    check("the bar appears", len(frames) >= 2, repr(tty[:400]))
    check("it names the step", any("report: tensorpool (1/8)" in f for f in frames), repr(frames[:3]))
    check("it finishes at 100%", bool(frames) and "100%" in frames[-1] and "done" in frames[-1], repr(frames[-1:]))
    check("the last frame ends its line", "\n" in tty.split("\r")[-1], repr(tty[-120:]))
    check("the bar never goes back", [int(f.split("]")[1].split("%")[0]) for f in frames] ==
          sorted(int(f.split("]")[1].split("%")[0]) for f in frames), repr(frames))
    check("nothing of it on stdout", out == "", repr(out))

    status, out, err = piped(report)
    check("piped: exit 0", status == 0, err)
    check("piped: no bar", "\r" not in err and "%" not in err and "ETA" not in err, repr(err))
    check("piped: the one line saying what was written", err.strip().startswith("wrote ") and err.count("\n") == 1, repr(err))

    status, out, tty = on_tty(report + ["--quiet"])
    check("--quiet on a terminal: no bar", status == 0 and not bar_frames(tty) and "\r" not in tty.replace("\r\n", "\n"),
          repr(tty))

    status, out, tty = on_tty(report + ["--json"])
    check("--json on a terminal: no bar", status == 0 and not bar_frames(tty), repr(tty))
    try:
        check("--json: stdout is JSON", json.loads(out)["allocators"] is not None)
    except ValueError:
        check("--json: stdout is JSON", False, repr(out))

    status, out, tty = on_tty([binary, "compare", big])
    frames = bar_frames(tty)
    check("compare of a large trace draws a bar", status == 0 and frames and "replay tensorpool (1/8)" in tty
          and "100%" in frames[-1], repr(tty[:300]))
    check("compare's table stays on stdout, clean", "tensorpool" in out and "\r" not in out and "ETA" not in out, repr(out[:200]))
    status, out, tty = on_tty([binary, "compare", big, "--json"])
    check("compare --json of a large trace: no bar", status == 0 and not bar_frames(tty), repr(tty[:200]))
    check("compare --json: stdout is JSON", out.lstrip().startswith("{") and json.loads(out)["allocators"] is not None)
    status, out, tty = on_tty([binary, "compare", small])
    check("compare of a small trace: no bar", status == 0 and not bar_frames(tty), repr(tty[:200]))

    # fit and plan: a bar over their replays (whose number the bar estimates), ending at 100%.
    status, out, tty = on_tty([binary, "fit", small, "--allocators", "tensorpool,pytorch"])
    frames = bar_frames(tty)
    check("fit draws a bar that finishes", status == 0 and frames and "fit: 2 allocator(s)" in tty
          and "100%" in frames[-1] and all("100%" not in f for f in frames[:-1]), repr(tty[:300]))
    check("fit's table stays on stdout", "fits GiB" in out and "\r" not in out, repr(out[:200]))
    status, out, tty = on_tty([binary, "fit", small, "--allocators", "tensorpool", "--json"])
    check("fit --json: no bar, JSON on stdout", status == 0 and not bar_frames(tty) and json.loads(out)["allocators"], repr(tty))
    plan = [binary, "plan", "--model", "custom", "--global-batch", "16", "--capacity", "3GiB", "--allocators", "tensorpool",
            "--options", "layers:2,hidden:512,heads:8,kv_heads:8,ffn:2048,vocab:4000,seq:512,steps:1"]
    status, out, tty = on_tty(plan)
    frames = bar_frames(tty)
    check("plan draws a bar that finishes", status == 0 and frames and "plan: 1 allocator(s)" in tty and "100%" in frames[-1],
          repr(tty[:300]))
    status, out, err = piped(plan)
    check("plan piped: no bar", status == 0 and "\r" not in err and "ETA" not in err, repr(err[:200]))

finish()
