"""Scheduled evaluation suites: suite files, metrics, runs on the job pipeline, history, reports, beat.

The control plane only: nothing here imports torch or worker/ (the CLI passes an embedded executor).
Entry points: `suite_loader.load_suite_file`, `plan.start_run`, `collect.collect`, `beat.run_beat`.
"""
