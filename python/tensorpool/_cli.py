"""The tensorpool command-line tool from Python: the `tensorpool` console script and
`python -m tensorpool` run the compiled CLI installed inside this package
(tensorpool/bin/tensorpool, put there by `pip install .`), or the one $TENSORPOOL_CLI names
(a build tree's tools/tensorpool)."""
import os
import sys

_BINARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tensorpool")


def executable():
    """The path of the tensorpool CLI this module runs; FileNotFoundError when there is none."""
    env = os.environ.get("TENSORPOOL_CLI")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"tensorpool: TENSORPOOL_CLI={env} is not a file")
        return env
    if os.path.isfile(_BINARY):
        return _BINARY
    raise FileNotFoundError(
        f"tensorpool: the tensorpool CLI is not installed at {_BINARY} (this module was not "
        "installed with `pip install .`): build it (cmake --build build --target tensorpool_cli) "
        "and set TENSORPOOL_CLI to the path of build/tools/tensorpool")


def main(argv=None):
    """Runs the CLI with `argv` (default: this process's arguments) in place of this process,
    as `tensorpool` (so its --help and errors read as the CLI's own)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        path = executable()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, ["tensorpool", *args])
    return 0  # not reached: execv replaces the process or raises
