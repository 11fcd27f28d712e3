"""The image tag the Docker tests build (its own module: `from conftest import` is ambiguous across folders)."""

TEST_IMAGE = "agent-rl-sandbox:test"
