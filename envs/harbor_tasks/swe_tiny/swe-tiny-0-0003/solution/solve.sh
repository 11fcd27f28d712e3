#!/bin/bash
cat > /app/tools.py <<'PYEOF'
"""tools: small helpers."""


def with_tax(price):
    """The price with 7% tax added."""
    return price * (100 + 7) / 100
PYEOF
