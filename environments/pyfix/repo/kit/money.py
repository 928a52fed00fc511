"""Money amounts held as integer cents."""


def format_cents(cents: int, symbol: str = "$") -> str:
    """1234567 -> "$12,345.67"; negative amounts put the sign first: "-$1.50"."""
    dollars, rest = divmod(cents, 100)
    return f"{symbol}{dollars:,}.{rest:02d}"
