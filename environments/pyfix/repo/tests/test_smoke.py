import datetime as dt

from kit import dates, intervals, lru, money, roman, semver, stats, text, wordfreq


def test_mean_and_odd_median():
    assert stats.mean([1, 2, 3]) == 2
    assert stats.median([3, 1, 2]) == 2


def test_text():
    assert text.slugify("Hello World") == "hello-world"
    assert text.truncate("short", 10) == "short"


def test_semver_simple():
    assert semver.compare("1.2.3", "1.2.4") == -1


def test_intervals_overlap():
    assert intervals.merge([(1, 5), (3, 7)]) == [(1, 7)]


def test_lru_put():
    c = lru.LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1


def test_money_positive():
    assert money.format_cents(1234567) == "$12,345.67"


def test_roman():
    assert roman.to_roman(1994) == "MCMXCIV"


def test_weekend():
    assert dates.is_weekend(dt.date(2024, 1, 6))


def test_words():
    assert wordfreq.words("A b a") == ["a", "b", "a"]
