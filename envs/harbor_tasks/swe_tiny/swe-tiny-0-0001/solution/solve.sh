#!/bin/bash
cat > /app/core.py <<'PYEOF'
"""core: small helpers."""


def range_sum(a, b):
    """Sum of the integers from a to b, both included."""
    return sum(range(a, b + 1))
PYEOF
