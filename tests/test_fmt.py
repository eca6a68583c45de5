"""minilmd/fmt.py: the one duration formatter of the status screen, the logs and the GPU reports."""
import pytest

from minilmd.fmt import fmt_duration


@pytest.mark.parametrize("seconds, text", [(None, "-"), (-5, "0s"), (0, "0s"), (89, "89s"), (150, "2m"),
                                           (89 * 60, "89m"), (90 * 60, "1.5h"), (47 * 3600, "47.0h"),
                                           (3 * 86400, "3.0d")])
def test_fmt_duration(seconds, text):
    assert fmt_duration(seconds) == text
