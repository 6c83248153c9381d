"""The errors every layer raises (no dependencies, so any module can import them)."""
from __future__ import annotations


class DataError(ValueError):
    """Bad input data. The message always names the file and row that caused it."""
