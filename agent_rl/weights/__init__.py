"""Publishing the learner's weights to the engines.

publish.py    the publisher the loop uses: memory | disk | broadcast, chosen once per run
lagged.py     rollout.fixed_lag (research): engines sample with weights exactly k versions old
broadcast.py  the broadcast path: learner rank 0 -> engine processes (SGLang's weight-group protocol)
group.py      the wire protocol of that group (rendezvous, tensor metadata, send/receive)
tensors.py    reading safetensors dirs, in-place copies into a model, /dev/shm hand-off
"""
