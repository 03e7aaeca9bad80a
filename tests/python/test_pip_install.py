#!/usr/bin/env python3
"""tests/python/test_pip_install.py: `pip install .` as a Python user runs it.

    test_pip_install.py SOURCE_DIR BUILD_TREE_CLI WORK_DIR [TRACE]

From a clone of SOURCE_DIR's committed HEAD (kept in WORK_DIR and brought up to date, so a rerun
rebuilds only what changed), in a virtual environment of its own: `pip install` (scikit-build-core
from PyPI; CMake, Ninja, the compiler and the C++ dependencies from the system), then
  - `tensorpool --help` from the console script and `python -m tensorpool --help` equal the build
    tree's CLI's;
  - `tensorpool fit TRACE --json` and tensorpool.fit(TRACE) equal the build tree's (but for host
    timings), and so does tensorpool.fit on the snapshot as a dict;
  - bad input through the Python API raises TensorpoolCliError with the CLI's own message;
  - `python -c "import tensorpool; ..."` allocates through the installed C library (simulated
    backend, no GPU) and reads the statistics back;
  - the installed binaries need no library outside the C and C++ runtimes;
  - a missing C++ compiler is a clear error naming it.
Exit 77 (CTest: skipped) when the package index cannot be reached or venv is missing; the reason
is printed.
"""
import json
import os
import subprocess
import sys
import tempfile

from replay_json import without_timings

SKIP = 77


def run(cmd, **kwargs):
    kwargs.setdefault("check", True)
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(cmd, **kwargs)


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def expect(condition, message):
    if not condition:
        fail(message)
    print(f"ok: {message}")


def up_to_date_clone(source, clone):
    rev = run(["git", "-C", source, "rev-parse", "HEAD"], check=False)
    if rev.returncode != 0:
        print(f"SKIP: {source} is not a git checkout, so there is no committed HEAD to clone")
        sys.exit(SKIP)
    head = rev.stdout.strip()
    if run(["git", "-C", source, "status", "--porcelain", "--untracked-files=no"]).stdout.strip():
        print("note: the source has uncommitted changes; this tests the committed HEAD, without them")
    if not os.path.isdir(os.path.join(clone, ".git")):
        run(["git", "clone", "--quiet", source, clone])
    run(["git", "-C", clone, "fetch", "--quiet", source, head])
    run(["git", "-C", clone, "reset", "--quiet", "--hard", head])
    run(["git", "-C", clone, "clean", "--quiet", "-fdx", "-e", "build-wheel/"])
    return head


def venv(work):
    env_dir = os.path.join(work, "venv")
    if not os.path.exists(os.path.join(env_dir, "bin", "python")):
        done = run([sys.executable, "-m", "venv", env_dir], check=False)
        if done.returncode != 0:
            print(f"SKIP: python -m venv failed: {done.stderr.strip()}")
            sys.exit(SKIP)
    return os.path.join(env_dir, "bin")


def main():
    source, build_cli, work = sys.argv[1:4]
    trace = sys.argv[4] if len(sys.argv) > 4 else None
    os.makedirs(work, exist_ok=True)
    clone = os.path.join(work, "clone")
    head = up_to_date_clone(source, clone)
    bin_dir = venv(work)
    pip = [os.path.join(bin_dir, "python"), "-m", "pip"]
    probe = run([*pip, "download", "--quiet", "--no-deps", "-d", os.path.join(work, "probe"), "scikit-build-core"],
                check=False)
    if probe.returncode != 0:
        print(f"SKIP: the package index is not reachable (pip download scikit-build-core: {probe.stderr.strip()[-300:]})")
        return SKIP

    build_dir = os.path.join(work, "wheel-build")
    install = run([*pip, "install", "--quiet", "--force-reinstall", "--no-deps",
                   f"--config-settings=build-dir={build_dir}", clone], check=False)
    if install.returncode != 0:
        fail(f"pip install of {head} failed:\n{install.stdout[-4000:]}\n{install.stderr[-4000:]}")
    print(f"ok: pip install of {head[:12]}")
    console = os.path.join(bin_dir, "tensorpool")
    python = os.path.join(bin_dir, "python")
    env = {k: v for k, v in os.environ.items() if k not in ("TENSORPOOL_CLI", "TENSORPOOL_LIBRARY", "PYTHONPATH")}

    # The console script and python -m run the installed CLI, whose --help is the build tree's.
    build_help = run(["bash", "-c", 'exec -a tensorpool "$0" --help', build_cli]).stdout
    expect(run([console, "--help"], env=env).stdout == build_help, "`tensorpool --help` equals the build tree's")
    expect(run([python, "-m", "tensorpool", "--help"], env=env).stdout == build_help,
           "`python -m tensorpool --help` equals the build tree's")
    package = run([python, "-c", "import os, tensorpool; print(os.path.dirname(tensorpool.__file__))"],
                  env=env, cwd=work).stdout.strip()
    expect(package.startswith(os.path.join(work, "venv")), f"the package is the installed one ({package})")

    # The installed binaries need only the C and C++ runtimes (no fmt, spdlog, libcudart, libcuda).
    allowed = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libstdc++", "libgcc_s", "libdl.so",
               "libpthread.so", "librt.so")
    for name in ["bin/tensorpool", "libtensorpool_c.so", "libtensorpool_torch.so"]:
        path = os.path.join(package, name)
        if not os.path.exists(path):
            expect(name == "libtensorpool_torch.so", f"{name} is installed")
            continue
        needed = [line.split()[0] for line in run(["ldd", path]).stdout.splitlines() if line.strip()]
        extra = [lib for lib in needed if not os.path.basename(lib).startswith(allowed)]
        expect(not extra, f"{name} needs only the C and C++ runtimes (extra: {extra})")

    if trace is None or not os.path.exists(trace):
        print(f"note: no shared trace ({trace}): the CLI is compared on a generated trace")
        trace = os.path.join(work, "generated.tptrace")
        run([build_cli, "generate", "--model", "gpt2", "--seq", "256", trace])
    args = ["fit", trace, "--json", "-q", "--allocators", "tensorpool,pytorch"]
    expected = without_timings(json.loads(run([build_cli, *args]).stdout))
    got = without_timings(json.loads(run([console, *args], env=env).stdout))
    expect(got == expected, "`tensorpool fit --json` from the console script equals the build tree's")
    api = json.loads(run([python, "-c", (
        "import json, sys, tensorpool; "
        "print(json.dumps(tensorpool.fit(sys.argv[1], allocators=['tensorpool', 'pytorch'])))"), trace],
        env=env, cwd=work).stdout)
    expect(without_timings(api) == expected, "tensorpool.fit(path) equals the CLI's answer")
    if trace.endswith(".pickle"):
        api = json.loads(run([python, "-c", (
            "import json, pickle, sys, tensorpool; snapshot = pickle.load(open(sys.argv[1], 'rb')); "
            "print(json.dumps(tensorpool.fit(snapshot, allocators=['tensorpool', 'pytorch'])))"), trace],
            env=env, cwd=work).stdout)
        expect(without_timings(api) == expected, "tensorpool.fit(snapshot dict) equals the CLI's answer")

    # Bad input: the CLI's message, as a Python exception.
    truncated = os.path.join(work, "truncated.pickle")
    with open(trace if trace.endswith(".pickle") else build_cli, "rb") as f:
        head_bytes = f.read(300)
    with open(truncated, "wb") as f:
        f.write(head_bytes)
    cli_error = run([console, "fit", truncated, "--json"], env=env, check=False)
    expect(cli_error.returncode != 0 and cli_error.stderr.strip(), "the CLI refuses a truncated file")
    raised = run([python, "-c", (
        "import sys, tensorpool\n"
        "try:\n    tensorpool.fit(sys.argv[1])\n"
        "except tensorpool.TensorpoolCliError as e:\n    print(str(e)); sys.exit(3)\n"), truncated],
        env=env, cwd=work, check=False)
    expect(raised.returncode == 3 and raised.stdout.strip() == cli_error.stderr.strip(),
           f"tensorpool.fit raises TensorpoolCliError with the CLI's message ({raised.stdout.strip()!r})")

    # The C library, from Python, on the simulated backend (no GPU).
    c_api = run([python, "-c", (
        "import ctypes, tensorpool\n"
        "tensorpool.configure('backend:simulated')\n"
        "lib = tensorpool._library()\n"
        "ptr = ctypes.c_void_p()\n"
        "assert lib.tensorpool_alloc(tensorpool._handle(0), 3 << 20, 0, ctypes.byref(ptr)) == 0\n"
        "print(tensorpool.library_path())\n"
        "print(tensorpool.memory_allocated(0))\n"
        "assert lib.tensorpool_free(tensorpool._handle(0), ptr) == 0\n"
        "print(tensorpool.memory_allocated(0))\n")], env=env, cwd=work, check=False)
    lines = c_api.stdout.split()
    expect(c_api.returncode == 0 and len(lines) == 3 and lines[0].startswith(package)
           and lines[1] == str(3 << 20) and lines[2] == "0",
           f"the installed library allocates and counts from Python ({c_api.stdout.strip()!r} {c_api.stderr.strip()[-500:]!r})")

    # No C++ compiler: CMake says so, and pip fails.
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        no_compiler = run([*pip, "install", "--no-deps", f"--config-settings=build-dir={scratch}", clone],
                          env=dict(env, CXX="/nonexistent/c++"), check=False)
    output = no_compiler.stdout + no_compiler.stderr
    expect(no_compiler.returncode != 0 and "CMAKE_CXX_COMPILER" in output and "/nonexistent/c++" in output,
           "without a C++ compiler, pip install fails naming it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
