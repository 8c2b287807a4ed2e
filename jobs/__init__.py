"""freight's control plane: job specs, storage, planning, cost, status, fleet client and evals.

Light by rule: nothing here imports torch, worker/ or kernels/, not even inside a function (a laptop
submits jobs without torch); what both planes must agree on is in contracts/. The `freight` command
is freight_cli/.
"""
