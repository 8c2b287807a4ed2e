"""Suite-wide test settings. Fixtures live in each folder's own conftest.py."""

import os
import tempfile

import pytest


def _import_triton_interpreted() -> None:
    """Import triton's own language library with TRITON_INTERPRET=1 (then restore the variable).

    Triton decorates its standard library (tl.zeros, tl.sum, ...) when it is first imported, in the
    mode the variable gives then, and the interpreter cannot call functions decorated for compiling.
    Some tests import triton indirectly before tests/kernels/conftest.py sets up its interpreted
    kernels (transformers imports it to build a gpt-oss model), so the first import happens here.
    """
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.experimental.gluon  # noqa: F401  (gluon asserts the mode at its import)
        import triton.language  # noqa: F401
    except ImportError:  # triton absent: nothing to interpret
        pass
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def pytest_configure(config: pytest.Config) -> None:
    _import_triton_interpreted()
    # The suite's webhook receivers listen on 127.0.0.1, which freight refuses to send to unless
    # allowed (jobs/webhook_address.py); worker subprocesses inherit the variable. Tests of the
    # refusal build their Settings with notify_allow="".
    os.environ.setdefault("FREIGHT_NOTIFY_ALLOW", "127.0.0.1")
    """Finished jobs feed `freight estimate`'s profile store: keep the suite's (and its worker
    subprocesses') profiles out of the user's ~/.cache/freight/profiles.json."""
    if "FREIGHT_PROFILES_PATH" not in os.environ:
        folder = tempfile.mkdtemp(prefix="freight-test-profiles-")
        os.environ["FREIGHT_PROFILES_PATH"] = os.path.join(folder, "profiles.json")
