"""Research studies of what the loop learns, each run in the background with its runs kept and resumable.

``python -m studies.dynamics`` (the population against the single agent over seeds, with its controls;
docs/dynamics.md), ``studies.learning`` (probes of learning on the tiny model), ``studies.student_rl`` and
``studies.retention``. Their statistics are ``reporting.study``'s; the last stdout line is one JSON object.
"""
