"""An arithmetic agent written against the official openai client with native function calling (see agent.py)."""
