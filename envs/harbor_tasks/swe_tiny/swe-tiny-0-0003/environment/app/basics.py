"""basics: small helpers."""


def with_discount(price):
    """The price with 22% off."""
    return price * (100 - 23) / 100
