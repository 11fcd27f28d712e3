"""Rollout workers: episodes between engines and environments, feeding the buffer (workers.py)."""
