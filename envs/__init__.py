"""Environments: YAML definitions and the Python that runs them (SimpleTIR protocol, rewards, data sets).

spec = envs.load("envs/tiny_arith.yaml")
env = envs.make(spec, tokenizer, sandbox=shared_sandbox)   # one Env per episode
"""

from envs.datasets import DatasetReport
from envs.env import Env, make, make_sandbox
from envs.loop_resources import close_shared_sandboxes
from envs.spec import EnvSpec, load
from envs.types import EnvError, StepInfo, StepResult, Task
from envs.yamlio import ConfigError

__all__ = [
    "ConfigError",
    "DatasetReport",
    "Env",
    "EnvError",
    "EnvSpec",
    "StepInfo",
    "StepResult",
    "Task",
    "close_shared_sandboxes",
    "load",
    "make",
    "make_sandbox",
]
