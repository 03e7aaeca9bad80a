"""tests/python/torch_here.py: the tests that run PyTorch itself start with

    from torch_here import torch   # noqa: E402

which imports torch here, or else runs the test again (os.execv, same arguments) with the
interpreter TENSORPOOL_TORCH_PYTHON names or the project's .venv-torch/bin/python
(scripts/install-deps.sh torch), or else exits 77: CTest's "skipped" for these tests.
"""
import os
import sys

try:
    import torch  # noqa: F401
except ImportError:
    _ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    _OTHER = os.environ.get("TENSORPOOL_TORCH_PYTHON") or os.path.join(_ROOT, ".venv-torch", "bin", "python")
    if os.path.isfile(_OTHER) and os.path.abspath(_OTHER) != os.path.abspath(sys.executable):
        os.execv(_OTHER, [_OTHER] + sys.argv)
    print("skipped: no torch here (run scripts/install-deps.sh torch, or set TENSORPOOL_TORCH_PYTHON to an "
          "interpreter that has it)")
    sys.exit(77)
