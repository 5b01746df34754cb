"""A run's records and reports (pure, no Ray): what a run leaves on disk and what is read back from it.

``reporting.run_dir`` the run directory (config, metrics.jsonl, samples, status, logs, TensorBoard; its
checkpoints are ``checkpoints``'s); ``reporting.step_metrics`` the metrics row of one step;
``reporting.report`` (``python -m reporting RUN_DIR [OTHER_RUN]``) the plots and ``summary.md``, with
``reporting.report_summary`` and ``reporting.report_trends`` behind them.
"""
