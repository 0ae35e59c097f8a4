"""``python -m pytest_kopt.child``: one harness request, a warm process, or the fork server that forks
warm processes (see :mod:`pytest_kopt.child`)."""

import os
import sys

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--fork-server":  # the fork server (pytest_kopt.child.forkserver)
        from pytest_kopt.child.forkserver import serve

        opts = dict(zip(sys.argv[3::2], sys.argv[4::2]))  # --listen FD --token-sha SHA --workers N
        sys.exit(serve(int(sys.argv[2]), int(opts["--listen"]) if "--listen" in opts else None,
                       opts.get("--token-sha", ""), int(opts.get("--workers", 0))))
    from pytest_kopt.child.protocol import main

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    sys.exit(main(sys.argv))
