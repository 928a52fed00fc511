from envkit_check import function

top_words = function("kit.wordfreq.top_words")


def test_ties_alphabetical():
    assert top_words("b a b a c", 2) == [("a", 2), ("b", 2)]


def test_all_ties():
    assert top_words("z y x", 3) == [("x", 1), ("y", 1), ("z", 1)]


def test_count_first_then_alpha():
    assert top_words("c c b a a d", 3) == [("a", 2), ("c", 2), ("b", 1)]
