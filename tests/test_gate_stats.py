"""Two-sided paired statistics for reports, beside the one-sided test the gate keeps."""

import math

import pytest

from selftaught.errors import InputError
from selftaught.stats import (
    min_detectable_difference,
    min_detectable_wins,
    sign_test_pvalue,
    sign_test_two_sided,
)


def test_two_sided_sign_test_is_twice_the_smaller_tail_capped_at_one():
    # 10 wins / 6 losses (the seed-7 pairing): one-sided 0.227, two-sided 0.455
    assert sign_test_pvalue(10, 6) == pytest.approx(0.2272491, abs=1e-6)
    assert sign_test_two_sided(10, 6) == pytest.approx(2 * 0.2272491, abs=1e-6)
    assert sign_test_two_sided(6, 10) == sign_test_two_sided(10, 6)  # symmetric
    assert sign_test_two_sided(3, 3) == 1.0 and sign_test_two_sided(0, 0) == 1.0
    # all 5 discordant pairs one way: 2 * 2^-5
    assert sign_test_two_sided(5, 0) == pytest.approx(2 / 32)
    # exact against the binomial sum, for a lopsided split
    tail = sum(math.comb(30, k) for k in range(21, 31)) / 2**30
    assert sign_test_two_sided(9, 21) == pytest.approx(2 * tail)


def test_two_sided_is_never_below_the_one_sided_p_of_the_observed_direction():
    for wins in range(0, 12):
        for losses in range(0, 12):
            one = min(sign_test_pvalue(wins, losses), sign_test_pvalue(losses, wins))
            assert sign_test_two_sided(wins, losses) >= one - 1e-12


def test_smallest_detectable_difference_at_five_percent():
    assert min_detectable_wins(0.05) == 6  # 2 * 2^-6 = 0.031 < 0.05; 5 gives 0.0625
    assert min_detectable_wins(0.01) == 8  # 2 * 2^-8 = 0.0078
    assert min_detectable_difference(50) == pytest.approx(0.12)
    assert min_detectable_difference(400) == pytest.approx(0.015)
    assert min_detectable_difference(5) is None  # 5 items cannot show anything
    with pytest.raises(InputError, match="alpha"):
        min_detectable_wins(0.0)
    with pytest.raises(InputError, match="counts"):
        sign_test_two_sided(-1, 2)
