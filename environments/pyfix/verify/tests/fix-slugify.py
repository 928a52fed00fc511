from envkit_check import function

slugify = function("kit.text.slugify")


def test_collapses_spaces():
    assert slugify("a  b") == "a-b"


def test_collapses_punctuation():
    assert slugify("Rock & Roll") == "rock-roll"


def test_collapses_existing_separators():
    assert slugify("x--y") == "x-y"


def test_custom_separator():
    assert slugify("A  B", sep="_") == "a_b"
