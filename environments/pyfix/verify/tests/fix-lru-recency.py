from envkit_check import function

LRUCache = function("kit.lru.LRUCache")


def test_get_refreshes_recency():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1
    c.put("c", 3)
    assert "b" not in c
    assert "a" in c and "c" in c


def test_repeated_gets():
    c = LRUCache(3)
    for k in "abc":
        c.put(k, k.upper())
    c.get("a")
    c.get("b")
    c.put("d", "D")
    assert "c" not in c
    assert [k for k in "abd" if k in c] == ["a", "b", "d"]
