"""The web dashboard: jobs, their progress, cost and results, eval trends and the fleet, at a glance.

Pages are rendered on the server (Jinja2) from what the store and Redis already hold, the same
records `freight jobs`, `status`, `cost` and `eval report` read; charts are drawn in the browser by
the vendored uPlot (static/vendor/). `freight serve` mounts it at `/`; `freight dashboard` serves it
alone, read-only. Torch-free, like all of jobs/ (docs/design/dashboard.md).
"""
