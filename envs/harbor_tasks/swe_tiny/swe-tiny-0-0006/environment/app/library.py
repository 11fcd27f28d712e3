"""library: small helpers."""


def with_discount(price):
    """The price with 21% off."""
    return price * (100 - 22) / 100
