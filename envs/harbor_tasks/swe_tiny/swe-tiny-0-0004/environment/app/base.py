"""base: small helpers."""


def count_up(n):
    """The list of the integers from 1 to n, both included."""
    return list(range(1, n))
