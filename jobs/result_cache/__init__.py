"""The result cache: answers of deterministic rows kept across jobs (docs/design/result-cache.md).

Torch-free storage and options; the keys and what goes in them are the worker's
(worker/result_cache.py)."""
