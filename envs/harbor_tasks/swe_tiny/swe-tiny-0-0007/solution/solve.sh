#!/bin/bash
cat > /app/helpers.py <<'PYEOF'
"""helpers: small helpers."""


def range_sum(a, b):
    """Sum of the integers from a to b, both included."""
    return sum(range(a, b + 1))
PYEOF
