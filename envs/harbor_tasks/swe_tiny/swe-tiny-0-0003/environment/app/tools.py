"""tools: small helpers."""


def with_tax(price):
    """The price with 7% tax added."""
    return price * (100 + 8) / 100
