"""The harness every comparative benchmark and study runs on (docs/benchmarks/harness.md):

- `runner`: cells x seeds interleaved and rotated, resume by cell, a time limit that drains, a tuning pass;
- `stats`: mean ± SE, the 2-SE rule and its words, medians of per-seed ratios, time to target;
- `provenance`: commit, CPU model and flags, cores, load before and after, versions;
- `report`: where results go (committed or scratch), the JSON + markdown writer, the figure helpers;
- `pool`: runs in their own processes, N at a time, re-planned as each finishes, drained and stopped by signal;
- `train`: an `agent-rl train` run in its own process, and its step records;
- `cores`: how busy the machine's cores were over a run (/proc/stat, every user of the machine).
"""
