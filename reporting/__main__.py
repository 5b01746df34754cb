"""``python -m reporting RUN_DIR [OTHER_RUN ...]``: the plots and summary.md of a run (``reporting.report``)."""

import sys

from reporting.report import main

sys.exit(main())
