"""tools: small helpers."""


def difference(a, b):
    """How much larger a is than b."""
    return b - a
