"""C kernels for the CPU, compiled for this machine on first use (kernels/cpu/build.py)."""
