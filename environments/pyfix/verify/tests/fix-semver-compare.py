from envkit_check import function

compare = function("kit.semver.compare")
newest = function("kit.semver.newest")


def test_minor_numeric():
    assert compare("1.10.0", "1.9.0") == 1


def test_major_numeric():
    assert compare("10.0.0", "9.9.9") == 1


def test_patch_numeric():
    assert compare("1.0.2", "1.0.10") == -1


def test_newest():
    assert newest(["1.2.9", "1.2.10", "1.2.1"]) == "1.2.10"
