import math

import pytest

from exporter.parse.numbers import finite_float


@pytest.mark.parametrize("raw, want", [("0.9", 0.9), ("16", 16.0), (3, 3.0), (2.5, 2.5), ("1e3", 1000.0)])
def test_finite_numbers_are_read(raw, want):
    assert finite_float(raw) == want


@pytest.mark.parametrize("raw", [None, True, False, "None", "", "auto", "nan", "inf", "-inf", math.nan, [1], {}])
def test_absent_unreadable_and_non_finite_values_are_none(raw):
    assert finite_float(raw) is None
