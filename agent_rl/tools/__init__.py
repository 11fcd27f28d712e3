"""Developer tools beside the framework: `agent-rl tiny-model` (tiny.py), `agent-rl prepare` (pretrained.py),
`agent-rl sft` (sft.py), `agent-rl data pull` (data_pull.py)."""
