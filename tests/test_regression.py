"""The study runner keeps every study's behaviour: a small grid of each study (format grid with CP-LN,
Promptception, judge scores with pairwise and self-generation; :mod:`regression_grid`) gives exactly the rows
that the code before the runner was unified stored (``tests/data/regression``, written by that code)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from regression_grid import TABLES, build, comparable

REFERENCE = Path(__file__).parent / "data" / "regression"


@pytest.fixture(scope="module")
def tables(tmp_path_factory, tiny_vlm):
    return build(tmp_path_factory.mktemp("regression"), tiny_vlm)


@pytest.mark.parametrize("name", TABLES)
def test_study_rows_equal_the_reference(tables, name):
    expected = comparable(pd.read_parquet(REFERENCE / f"{name}.parquet"))
    got = comparable(tables[name])
    assert sorted(got.columns) == sorted(expected.columns)   # the order of columns is no behaviour
    got = got[list(expected.columns)]
    assert len(got) == len(expected) > 0
    # float columns (logits, log-likelihoods) to float32 precision: other CPUs differ in the last bits
    pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-4, atol=1e-5, check_dtype=False)
