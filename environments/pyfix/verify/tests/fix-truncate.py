from envkit_check import function

truncate = function("kit.text.truncate")


def test_result_fits_width():
    assert truncate("hello world", 8) == "hello..."


def test_custom_ellipsis():
    assert truncate("abcdef", 5, "…") == "abcd…"


def test_width_equal_to_ellipsis():
    assert truncate("abcdef", 3) == "..."


def test_never_longer_than_width():
    for width in range(3, 12):
        assert len(truncate("the quick brown fox", width)) <= width
        assert len(truncate("the quick brown fox", width)) == width
