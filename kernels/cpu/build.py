"""Compile freight's C kernels for this machine's CPU on first use and load them with ctypes.

Like Triton's launchers, the build happens at run time with the system C compiler (`$CC`, else `cc`
or `gcc`), here with -march=native, so the library is cached per source, flags, compiler and CPU:
`$FREIGHT_KERNEL_CACHE`, else `kernels/` in `$FREIGHT_CACHE_DIR` (the folder freight's model cache
uses), else `~/.cache/freight/kernels`.
Concurrent builds are safe: each compiles into its own temporary file and renames it into place.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-std=gnu11", "-shared", "-fPIC")
LIBS = ("-lm", "-lpthread")


class KernelBuildError(RuntimeError):
    """The C kernel could not be compiled or loaded here (the callers fall back to torch ops)."""


def cache_dir() -> Path:
    if os.environ.get("FREIGHT_KERNEL_CACHE"):
        return Path(os.environ["FREIGHT_KERNEL_CACHE"])
    return Path(os.environ.get("FREIGHT_CACHE_DIR") or Path.home() / ".cache" / "freight") / "kernels"


def _compiler() -> str:
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)  # type: ignore[return-value]
    raise KernelBuildError("no C compiler found (set CC, or install gcc) for freight's CPU kernels")


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = [line for line in info if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(wanted))  # every core repeats them; keep one of each


def library_path(source: Path, compiler: str, extra_flags: tuple[str, ...] = ()) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    headers = [h.read_text() for h in sorted(source.parent.glob("*.h"))]  # what `#include "..."` can pull in
    key = hashlib.sha256(
        "\0".join([source.read_text(), *headers, " ".join(FLAGS + extra_flags + LIBS), version, _cpu_signature()]).encode()
    ).hexdigest()[:16]
    return cache_dir() / f"{source.stem}-{key}.so"


def load_library(source: Path, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Compile `source` (if not cached) and load it. Raises KernelBuildError with the compiler's output.
    extra_flags follow FLAGS on the command line (e.g. "-mno-avx512f": a narrower instruction set of
    this CPU, which the tests use to check every path a kernel has)."""
    compiler = _compiler()
    path = library_path(source, compiler, extra_flags)
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                built = Path(tmp) / path.name
                proc = subprocess.run(
                    [compiler, *FLAGS, *extra_flags, "-o", str(built), str(source), *LIBS],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                if proc.returncode != 0:
                    raise KernelBuildError(f"{compiler} could not build {source.name}: {proc.stderr.strip()[-2000:]}")
                os.replace(built, path)
        except OSError as exc:
            raise KernelBuildError(f"cannot build {source.name} under {path.parent}: {exc}") from exc
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelBuildError(f"cannot load {path}: {exc}") from exc
