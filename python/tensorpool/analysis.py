"""The CLI's analyses from Python: compare, fit, info and report on a trace, and plan on a model,
returning plain data (what the CLI's --json prints, parsed).

    import tensorpool
    rows = tensorpool.compare("snapshot.pickle", capacity="40GiB", allocators=["tensorpool", "pytorch"])
    sizes = tensorpool.fit(torch.cuda.memory._snapshot())     # a snapshot dict works too
    tensorpool.report("snapshot.pickle")                       # shows itself in Jupyter
    answer = tensorpool.plan("gpt2-xl", capacity="24GiB", global_batch=64,
                             options={"precision": "autocast-bf16"})["answer"]["text"]

A trace is a path (a PyTorch snapshot .pickle, an RMM log .csv, a .tptrace or .jsonl) or the dict
torch.cuda.memory._snapshot() returns (written to a temporary pickle for the CLI). Keyword
arguments are the subcommand's options (`tensorpool SUBCOMMAND --help`), with dashes as
underscores: True adds a flag (attempt_ooms=True), a list is comma-separated (allocators), a
dict is repeated as NAME=VALUE (allocator_conf={"rmm-pool": "initial_pool_size:0"}), anything
else is passed as text (capacity="40GiB", warmup=1).

The analyses run the compiled CLI (tensorpool._cli.executable()) in a child process: an input
the CLI refuses raises TensorpoolError with the CLI's own message (file, offset, what was
expected) and exit status, and cannot take the interpreter down with it.
"""
import contextlib
import html
import json
import os
import pickle
import subprocess
import tempfile

from tensorpool import TensorpoolError
from tensorpool._cli import executable

__all__ = ["compare", "fit", "info", "plan", "report", "Report", "TensorpoolCliError"]


class TensorpoolCliError(TensorpoolError):
    """The CLI refused its input; the message is the CLI's (from its stderr), `returncode` its
    exit status, `command` what ran, and `status` "cli"."""

    def __init__(self, message, returncode, command):
        super().__init__(message, "cli")
        self.returncode = returncode
        self.command = command


@contextlib.contextmanager
def _trace_path(trace):
    """A path the CLI can read `trace` from (a snapshot dict goes through a temporary pickle)."""
    if isinstance(trace, dict):
        with tempfile.TemporaryDirectory(prefix="tensorpool-") as tmp:
            path = os.path.join(tmp, "snapshot.pickle")
            with open(path, "wb") as f:
                pickle.dump(trace, f, protocol=4)  # plain data, as torch's _dump_snapshot writes it
            yield path
        return
    if isinstance(trace, (str, os.PathLike)):
        yield os.fspath(trace)
        return
    raise TypeError(f"tensorpool: a trace is a path or a snapshot dict, not {type(trace).__name__}")


def _options(options):
    args = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, dict):
            for name, conf in value.items():
                args += [flag, f"{name}={conf}"]
        elif isinstance(value, (list, tuple)):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, str(value)]
    return args


def _run(subcommand, trace, options, extra=()):
    with _trace_path(trace) as path:
        command = [executable(), subcommand, path, *_options(options), *extra]
        return _run_command(subcommand, command)


def _run_command(subcommand, command):
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        message = done.stderr.strip() or f"tensorpool {subcommand} exited with status {done.returncode}"
        raise TensorpoolCliError(message, done.returncode, command)
    return done.stdout


def _run_json(subcommand, trace, options):
    result = json.loads(_run(subcommand, trace, dict(options, json=True)))
    if isinstance(trace, dict) and isinstance(result, dict) and "trace" in result:
        result["trace"] = "<snapshot dict>"  # not the temporary file, gone by now
    return result


def compare(trace, **options):
    """`tensorpool compare TRACE --json`: each allocator's replay of the trace, side by side."""
    return _run_json("compare", trace, dict(options, quiet=True))


def fit(trace, **options):
    """`tensorpool fit TRACE --json`: the smallest device each allocator replays the trace on."""
    return _run_json("fit", trace, dict(options, quiet=True))


def plan(model, global_batch, options=None, **flags):
    """`tensorpool plan --model MODEL --global-batch N --json`: the largest micro-batch each
    allocator fits, the answer in words (`["answer"]["text"]`) and the changes that fit a larger
    one. `options` are the workload keys (docs/workloads.md), as a dict or as "key:value,..."
    text; other keywords are plan's flags (capacity="24GiB", allocators=[...], report="p.html")."""
    if isinstance(options, dict):
        options = ",".join(f"{key}:{value}" for key, value in options.items())
    flags = dict(flags, model=model, global_batch=global_batch, options=options or None, json=True, quiet=True)
    return json.loads(_run_command("plan", [executable(), "plan", *_options(flags)]))


def info(trace, **options):
    """`tensorpool info TRACE --json`: events, devices, streams, sizes and lifetimes."""
    return _run_json("info", trace, options)


class Report:
    """The HTML report of a trace (`tensorpool report`): `html` is the page (self-contained),
    `path` where it was written (None when it was not kept); Jupyter shows it inline."""

    def __init__(self, page, path):
        self.html = page
        self.path = path

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)
        self.path = os.fspath(path)
        return self.path

    def _repr_html_(self):
        return (f'<iframe srcdoc="{html.escape(self.html, quote=True)}" '
                'style="width:100%;height:900px;border:0"></iframe>')

    def __repr__(self):
        where = self.path if self.path else "not saved"
        return f"<tensorpool.Report, {len(self.html)} characters, {where}>"


def report(trace, output=None, **options):
    """`tensorpool report TRACE -o OUTPUT`: the self-contained HTML report, kept at `output`
    when given. Returns a Report."""
    with tempfile.TemporaryDirectory(prefix="tensorpool-") as tmp:
        path = os.fspath(output) if output is not None else os.path.join(tmp, "report.html")
        _run("report", trace, dict(options, quiet=True, output=path))
        with open(path, encoding="utf-8") as f:
            page = f.read()
    return Report(page, path if output is not None else None)
