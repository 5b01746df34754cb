"""Moved to ``reporting.report``: ``python -m reporting RUN_DIR`` replaces ``python -m actors.report RUN_DIR``.

This entry point keeps working for one release and says where it moved; it goes in the next.
"""

import sys

from reporting.report import main

MOVED = "note: `python -m actors.report` moved to `python -m reporting` (this old entry point goes in the next release)"

if __name__ == "__main__":
    print(MOVED, file=sys.stderr)
    sys.exit(main())
