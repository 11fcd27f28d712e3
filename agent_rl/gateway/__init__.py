"""The recording gateway: train an agent written against the OpenAI client (docs/guides/openai-gateway.md, "Training an agent").

server.py   OpenAI-compatible endpoint per episode in front of any engine client; records every call
prompt.py   chat messages -> prompt ids (the prefix-extension rule: an agent that only appends never forks)
assemble.py recorded calls -> trajectories (split when a prompt does not extend an earlier one)
episode.py  one agent episode inside the async training loop (buffer, staleness bound, reward)
listener.py the gateway's listening socket, accepted by hand so that no connection outlives its close
"""
