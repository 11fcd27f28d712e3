"""The `agent-rl train` command line of benchmarks/harness/train.py, for the benchmarks that import it as a neighbour."""

from bench_paths import ROOT  # noqa: F401  (puts the checkout on sys.path)

from benchmarks.harness.train import train_command

__all__ = ["train_command"]
