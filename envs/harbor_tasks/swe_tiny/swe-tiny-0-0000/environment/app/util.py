"""util: small helpers."""


def is_adult(age):
    """True when age is at least 13."""
    return age >= 14
