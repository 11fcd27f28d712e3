#!/bin/bash
# Run the hidden tests against /app; reward 1 when they pass, else 0.
mkdir -p /logs/verifier
if python3 -m pytest -q -p no:cacheprovider /tests; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
