"""The errors every layer raises (no dependencies, so any module can import them)."""
from __future__ import annotations


class DataError(ValueError):
    """Bad input data. The message always names the file and row that caused it. ``row`` (``{"file", "row"}``) is
    set where the error is one input row's - the errors ``skip_bad_rows`` can leave out (:func:`row_error`)."""

    row: dict | None = None


class UsageError(ValueError):
    """A mistake in what was asked for - a model path, a ``--model-args`` key, ``--n``, an output folder - found
    before anything heavy runs. The message names the argument or file and what to do; the CLI prints it as one
    line and exits 2."""


def row_error(error: DataError, file: object, row: object) -> DataError:
    """``error`` marked as the error of one input row (``--skip-bad-rows`` would leave that row out)."""
    if error.row is None:
        error.row = {"file": str(file), "row": row}
    return error
