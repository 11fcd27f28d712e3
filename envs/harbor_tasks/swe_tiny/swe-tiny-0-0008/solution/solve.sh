#!/bin/bash
cat > /app/tools.py <<'PYEOF'
"""tools: small helpers."""


def difference(a, b):
    """How much larger a is than b."""
    return a - b
PYEOF
