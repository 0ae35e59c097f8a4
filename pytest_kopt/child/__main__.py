"""``python -m pytest_kopt.child``: one harness request, a warm process, or the fork server that forks
warm processes (see :mod:`pytest_kopt.child`)."""

import os
import sys

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--fork-server":  # the fork server (pytest_kopt.child.forkserver)
        from pytest_kopt.child.forkserver import serve

        sys.exit(serve(int(sys.argv[2])))
    from pytest_kopt.child.protocol import main

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main(sys.argv))
