"""``python -m pytest_kopt.child``: one harness request, or a warm process (see :mod:`pytest_kopt.child`)."""

import os
import sys

from pytest_kopt.child.protocol import main

if __name__ == "__main__":
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main(sys.argv))
