"""Triton kernels, one per file, each with the signature of its torch reference in kernels.reference.

Importing this package imports triton; whether the kernels run compiled (CUDA tensors) or in
Triton's CPU interpreter is fixed by TRITON_INTERPRET at import time (see launch.py).
"""
