#!/usr/bin/env python
"""Django's command-line utility for the efficiency service."""

import gc
import os
import sys


def main() -> None:
    argv = sys.argv[2:]
    if sys.argv[1:2] == ["analyze_artifact"]:
        # Parsing a local file needs no Django: its start-up (every app, the Celery app and its tasks) cost
        # 2.6 CPU-s before the parse began (issue 26). Django's own options still go through Django.
        # numpy's OpenBLAS starts a thread per core when imported: 0.13 against 0.08 CPU-s for
        # `import numpy` on the 2-core machine. No analysis multiplies matrices, so one thread; a value
        # the user set wins.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        from jobs.profiling import analyze

        if not analyze.wants_django(argv):
            # One parse, then exit: nothing it allocates forms reference cycles (the decoded events are
            # refcounted structs), so the cyclic collector would only rescan the imported modules each
            # time the trace's grid/block lists fill a generation (~20 ms of a 100 MB trace's 0.8 CPU-s).
            gc.disable()
            sys.exit(analyze.main(argv))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "efficiency.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
