"""util: small helpers."""


def is_positive(x):
    """True when x is greater than zero."""
    return x < 0
