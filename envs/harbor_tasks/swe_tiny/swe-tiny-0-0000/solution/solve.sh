#!/bin/bash
cat > /app/util.py <<'PYEOF'
"""util: small helpers."""


def is_adult(age):
    """True when age is at least 13."""
    return age >= 13
PYEOF
