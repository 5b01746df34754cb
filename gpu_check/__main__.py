"""``python -m gpu_check``: the GPU machine's check (``gpu_check.check``)."""

from gpu_check.check import main

raise SystemExit(main())
