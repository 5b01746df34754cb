"""Benchmark evaluation of every member of a run in one mixed-adapter engine pass.

Pure modules (no Ray): ``datasets`` (readers of the user's benchmark files), ``passk`` (the
unbiased pass@k estimator), ``code_judge`` (code answers judged in the verifier's sandbox),
``math_grade`` (Math-Verify in a worker process), ``prompts`` (benchmark prompts and answer
extraction), ``harness`` (one engine pass per benchmark for many models), ``report`` (results.json,
the markdown table, the chart). ``python -m evaluation`` is the command line (``__main__``).
"""
