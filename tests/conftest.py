"""Suite-wide test settings. Fixtures live in each folder's own conftest.py."""
