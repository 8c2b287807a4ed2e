"""Suite-wide test settings. Fixtures live in each folder's own conftest.py."""

import os
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Finished jobs feed `freight estimate`'s profile store: keep the suite's (and its worker
    subprocesses') profiles out of the user's ~/.cache/freight/profiles.json."""
    if "FREIGHT_PROFILES_PATH" not in os.environ:
        folder = tempfile.mkdtemp(prefix="freight-test-profiles-")
        os.environ["FREIGHT_PROFILES_PATH"] = os.path.join(folder, "profiles.json")
