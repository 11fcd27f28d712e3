"""core: small helpers."""


def to_minutes(h):
    """Hours to minutes."""
    return h * 64
