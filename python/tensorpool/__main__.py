"""`python -m tensorpool ...`: the tensorpool CLI (see tensorpool._cli)."""
import sys

from tensorpool._cli import main

sys.exit(main())
