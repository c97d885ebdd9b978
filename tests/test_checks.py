"""The one check of a caller's numeric arguments."""

from __future__ import annotations

import math

import pytest

from statemachine.core.checks import non_negative_number, positive_int, positive_number
from statemachine.errors import InvalidInputError


@pytest.mark.parametrize("value", [1, 2, 10**30])
def test_a_positive_int_is_returned(value: int) -> None:
    assert positive_int("max_turns", value) == value


@pytest.mark.parametrize("value", [0, -1, True, False, 1.0, "3", None, math.nan])
def test_anything_else_is_refused_naming_the_argument_and_the_value(value: object) -> None:
    with pytest.raises(InvalidInputError, match=r"^max_turns must be a positive integer, got "):
        positive_int("max_turns", value)


def test_an_upper_bound_is_named() -> None:
    assert positive_int("limit", 5, at_most=5) == 5
    with pytest.raises(InvalidInputError, match="limit must be at most 5, got 6"):
        positive_int("limit", 6, at_most=5)


@pytest.mark.parametrize("value", [0.5, 1, 1e9])
def test_a_positive_number_is_returned_as_a_float(value: float) -> None:
    assert positive_number("timeout", value) == float(value)
    assert isinstance(positive_number("timeout", value), float)


@pytest.mark.parametrize("value", [0, -0.5, math.nan, math.inf, -math.inf, True, "1", None])
def test_a_number_that_is_not_positive_and_finite_is_refused(value: object) -> None:
    with pytest.raises(InvalidInputError, match=r"^timeout must be a positive number, got "):
        positive_number("timeout", value)


def test_zero_is_not_negative() -> None:
    assert non_negative_number("grace_period", 0) == 0.0
    for bad in (-1, math.nan, math.inf, False):
        with pytest.raises(InvalidInputError, match="grace_period must be a number of at least 0"):
            non_negative_number("grace_period", bad)


def test_a_huge_value_is_shown_cut_short() -> None:
    with pytest.raises(InvalidInputError) as caught:
        positive_int("max_turns", "x" * 10_000)
    assert len(str(caught.value)) < 100
