import pytest
from envkit_check import function

compare = function("kit.semver.compare")

ORDER = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
         "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0"]


def test_prerelease_before_release():
    assert compare("1.0.0-alpha", "1.0.0") == -1
    assert compare("1.0.0", "1.0.0-alpha") == 1


@pytest.mark.parametrize("i", range(len(ORDER) - 1))
def test_spec_order(i):
    assert compare(ORDER[i], ORDER[i + 1]) == -1


def test_equal_prerelease():
    assert compare("2.1.0-rc.2", "2.1.0-rc.2") == 0
