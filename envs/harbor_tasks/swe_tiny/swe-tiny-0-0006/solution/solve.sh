#!/bin/bash
cat > /app/core.py <<'PYEOF'
"""core: small helpers."""


def to_fahrenheit(c):
    """Degrees Celsius to Fahrenheit."""
    return c * 9 / 5 + 32
PYEOF
