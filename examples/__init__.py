"""Examples: agents and scripts a user starts from (docs/guides/agent-frameworks.md)."""
