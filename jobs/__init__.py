"""freight's control plane: job specs, storage, planning, cost, status and the CLI.

Light by rule: nothing here imports torch, worker/ or kernels/ at module level.
"""
