"""Weights as files, shared memory and a broadcast group: the formats and transports that learners and
engines both use (neither side's code; nothing here imports agent_rl.engines or agent_rl.learners).

tensors.py    reading safetensors dirs, in-place copies into a model, /dev/shm hand-off
adapters.py   LoRA adapters: PEFT's tensor names and on-disk format
group.py      the wire protocol of the broadcast group (rendezvous, tensor metadata, send/receive)

Publishing them to the engines during a run (memory | disk | broadcast) is agent_rl/weight_sync/.
"""
