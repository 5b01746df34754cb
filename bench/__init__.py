"""Micro-benchmarks: each measures one part's speed or memory and prints one JSON object on its last stdout line.

Run one as a module from the repository root, ``python -m bench.<name>`` (``python -m bench.sandbox``,
``python -m bench.learner --help``); the README's benchmark table lists them. The research studies live in
``studies/``, the GPU machine's acceptance check in ``gpu_check/`` and the calibration in ``planning.calibrate``.
"""
