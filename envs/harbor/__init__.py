"""Harbor-format task suites: tasks read and validated (task.py), their images built offline (image.py),
episodes in their containers (env.py), the verifier's reward (verify.py), the oracle run (oracle.py)."""
