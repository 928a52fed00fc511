"""Roman numerals (1..3999)."""

_NUMERALS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]


def to_roman(n: int) -> str:
    if not 1 <= n <= 3999:
        raise ValueError("roman numerals cover 1..3999")
    out = []
    for value, letters in _NUMERALS:
        count, n = divmod(n, value)
        out.append(letters * count)
    return "".join(out)
