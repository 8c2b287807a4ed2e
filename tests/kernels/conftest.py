"""Triton kernels under Triton's CPU interpreter, scoped to this folder.

Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when its module is imported. So the
variable is set only while kernels.triton's modules are (re)imported here and restored right after:
the kernels in this process run interpreted on CPU tensors, and nothing else in the test session
(nor any subprocess it starts) sees the variable.
"""

import importlib
import os
import pkgutil
import sys

import pytest


def _import_interpreted() -> list[str]:
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        # triton imports gluon lazily on the first launch, and gluon asserts at import that its
        # (already decorated) standard library matches the mode: import it inside the window.
        import triton.experimental.gluon  # noqa: F401

        import kernels.triton as package

        names = [f"kernels.triton.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
        for name in names:
            if name in sys.modules:  # imported earlier in compiled mode: decorate again
                importlib.reload(sys.modules[name])
            else:
                importlib.import_module(name)
        return names
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


INTERPRETED_MODULES = _import_interpreted()


@pytest.fixture(autouse=True)
def _seed() -> None:
    import torch

    torch.manual_seed(0)
