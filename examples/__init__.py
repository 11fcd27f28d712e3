"""Examples: agents and scripts a user starts from (see README)."""
