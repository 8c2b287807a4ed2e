"""Triton kernels, each beside a torch reference with the same signature. Imports nothing of freight."""
