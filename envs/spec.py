"""The environment schema: one YAML file declares data, prompt, tool protocol, budgets, sandbox and reward.

Validated once into frozen pydantic models (unknown keys are errors); `envs.load` reports
problems as `file:line: dotted.field: message` through the shared loader in `envs.yamlio`.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from envs.yamlio import load_model

DATA_ENV_VAR = "AGENT_RL_DATA"
BUILTIN_DATASETS = (
    "aime2024",
    "aime2025",
    "math500",
    "gsm8k",
    "dapo_math_17k",
    "countdown",
    "simplelr_math_35",
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def resolve_root(root: str | None, yaml_path: Path | None) -> Path:
    """data.root (relative to the YAML file) wins; then $AGENT_RL_DATA; then ../shared/data beside the checkout."""
    if root is None:
        return default_data_root()
    path = Path(root).expanduser()
    return path if path.is_absolute() or yaml_path is None else (yaml_path.parent / path).resolve()


def default_data_root() -> Path:
    """$AGENT_RL_DATA, else ../shared/data beside the checkout (the project's snapshot) if it exists, else the
    cache `agent-rl data pull` fills (~/.cache/agent-rl/data)."""
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return Path(env).expanduser()
    beside = Path(__file__).resolve().parents[2] / "shared" / "data"
    return beside if beside.is_dir() else default_cache_root()


def default_cache_root() -> Path:
    """Where `agent-rl data pull` caches the data sets: $XDG_CACHE_HOME/agent-rl/data (~/.cache by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "agent-rl" / "data"


class DataSource(Strict):
    """One split: a built-in data set (with its defect fixes), a parquet/jsonl file with a field mapping, or a generator."""

    dataset: (
        Literal["aime2024", "aime2025", "math500", "gsm8k", "dapo_math_17k", "countdown", "simplelr_math_35"]
        | None
    ) = None
    part: Literal["train", "test"] = "test"
    """Which part of a built-in set that has both (gsm8k, countdown)."""
    path: str | None = None
    """A .parquet or .jsonl file, relative to the data root (or absolute)."""
    problem_field: str = "problem"
    """Dotted path into a row for the problem text (e.g. `prompt.0.content`); file sources only."""
    answer_field: str = "answer"
    id_field: str | None = None
    generator: Literal["tiny_arith", "tiny_chain", "tiny_multistep"] | None = None
    size: int = Field(1000, ge=1)
    """Generator sources: number of tasks."""
    seed: int = 0
    easy_fraction: float = Field(0.25, ge=0, le=1)
    """tiny_arith, tiny_chain: share of one-digit sums (solvable without the tool)."""
    chain_fraction: float = Field(0.2, ge=0, lt=1)
    """tiny_chain: share of multi-step chains (2-6 tool turns; the long tail of episode lengths)."""
    limit: int | None = Field(None, ge=1)
    """Keep only the first `limit` tasks (after fixes and de-duplication)."""

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> DataSource:
        kinds = [k for k in ("dataset", "path", "generator") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"give exactly one of dataset (one of {', '.join(BUILTIN_DATASETS)}), path (a parquet/jsonl file) "
                f"or generator (tiny_arith, tiny_chain, tiny_multistep); got {kinds or 'none'}"
            )
        return self

    @field_validator("path")
    @classmethod
    def _file_exists(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        if not v.endswith((".parquet", ".jsonl")):
            raise ValueError(f"{v!r}: expected a .parquet or .jsonl file")
        root = (info.context or {}).get("data_root")
        if root is not None and not (Path(root) / v).exists():
            raise ValueError(
                f"file not found: {Path(root) / v} (data root {root}; set data.root or ${DATA_ENV_VAR})"
            )
        return v


class DataConfig(Strict):
    root: str | None = None
    """Data directory; relative paths are relative to this YAML file. Default: $AGENT_RL_DATA or ../shared/data."""
    splits: dict[str, DataSource]
    """Split name -> source. `train` feeds rollouts; `test` is the default eval split."""

    @field_validator("splits")
    @classmethod
    def _has_splits(cls, v: dict[str, DataSource]) -> dict[str, DataSource]:
        if not v:
            raise ValueError("declare at least one split (e.g. train: {dataset: gsm8k, part: train})")
        return v

    def resolved_root(self, yaml_path: Path | None) -> Path:
        return resolve_root(self.root, yaml_path)


class PromptConfig(Strict):
    template: str = "{problem}"
    """User message (or plain prompt text). Placeholders: {problem}, {numbers}, {target}."""
    chat_template: bool = True
    """Apply the tokenizer's chat template (one user message + generation prompt); false: plain text."""
    system: str | None = None

    @field_validator("template")
    @classmethod
    def _names_problem(cls, v: str) -> str:
        if "{problem}" not in v:
            raise ValueError("the template must contain the {problem} placeholder")
        return v


class ObservationConfig(Strict):
    template: str = "```output\n{output}\n```\n"
    """Glue around the tool output; tokenized on its own and appended as environment tokens."""
    max_tokens: int = Field(512, ge=8)
    """Token budget for the output inside the template; longer output is cut in the middle."""
    on_error: Literal["last_line", "full"] = "last_line"
    """What of stderr to show when the code fails: its last line (SimpleTIR) or all of it."""
    empty: str = ""
    """Shown when the code printed nothing."""

    @field_validator("template")
    @classmethod
    def _names_output(cls, v: str) -> str:
        if v.count("{output}") != 1:
            raise ValueError("the observation template must contain {output} exactly once")
        return v


class ToolConfig(Strict):
    protocol: Literal["simple-tir"] = "simple-tir"
    """simple-tir: fenced ```python blocks; room for an OpenAI-style function-calling protocol later."""
    stop: tuple[str, ...] = ("\n```\n",)
    """Engine stop strings. The default matches a closing fence followed by a newline, never the opening
    "```python\\n" (there "```" is followed by "python"); the engine's output includes the matched string."""
    session: bool = False
    """Keep interpreter state across a trajectory's turns (sandbox.session()); default: fresh process per block."""
    observation: ObservationConfig = ObservationConfig()
    void_turn: Literal["mask", "keep"] = "mask"
    """A turn with neither code nor answer ends the episode; mask: its trajectory gets loss mask 0."""

    @field_validator("stop")
    @classmethod
    def _stop_not_opening(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for s in v:
            if not s:
                raise ValueError("empty stop string")
            if s in "```python\n":
                raise ValueError(f"stop string {s!r} also matches the opening fence '```python\\n'")
        return v


class TurnConfig(Strict):
    max_turns: int = Field(5, ge=1)
    """Model turns per episode (each code run starts a new turn)."""
    max_tokens_per_turn: int = Field(1024, ge=1)
    max_response_tokens: int = Field(4096, ge=1)
    """Budget for everything after the prompt: sampled and observation tokens."""


class SandboxConfig(Strict):
    backend: Literal["local", "docker", "http", "unsafe-subprocess"] = "local"
    options: dict[str, Any] = {}
    """Keyword options for sandboxes.create (e.g. pool_size)."""
    limits: dict[str, Any] = {}
    """Fields of sandboxes.Limits (checked when the sandbox is made)."""


class RewardConfig(Strict):
    type: Literal["math_verify", "integer", "countdown", "callable"] = "math_verify"
    timeout_s: float = Field(5.0, gt=0)
    """math_verify: hard wall-clock limit per comparison (the worker process is killed past it)."""
    import_path: str | None = None
    """callable: `package.module:function`, called as fn(response_text, task, **kwargs) -> float."""
    kwargs: dict[str, Any] = {}

    @model_validator(mode="after")
    def _callable_imports(self, info: ValidationInfo) -> RewardConfig:
        if self.type != "callable":
            if self.import_path is not None:
                raise ValueError(f"import_path is only used with type: callable (type is {self.type!r})")
            return self
        if not self.import_path or ":" not in self.import_path:
            raise ValueError("type: callable needs import_path: 'package.module:function'")
        load_callable(self.import_path, near=(info.context or {}).get("path"))
        return self


class McpServerConfig(Strict):
    """An MCP tool server the agent gets (by URL, streamable HTTP). Without `url`: the episode's own sandbox,
    served by the run as a `python` tool (the env's limits and tool.session), at a URL of its own per episode."""

    name: str = Field(min_length=1)
    url: str | None = None


class AgentConfig(Strict):
    """`type: agent`: an agent written against the OpenAI client runs each episode (envs/agent.py)."""

    import_path: str
    """`package.module:function`, an async function called as
    `await fn(task, client, sandbox, **kwargs)` with an `openai.AsyncOpenAI` bound to the episode's gateway
    session; it returns the reward (a number) or its final answer (a string, scored by `reward`)."""
    kwargs: dict[str, Any] = {}
    tool_parser: Literal["hermes", "qwen", "llama3_json", "none"] = "hermes"
    """How the gateway finds tool calls in the model's output (agent_rl/openai/tool_parsers.py):
    hermes/qwen for `<tool_call>{json}</tool_call>` (Qwen2.5, Qwen3), llama3_json for Llama 3.x."""
    reasoning_parser: Literal["qwen3", "none"] = "none"
    """How the gateway splits reasoning off into `reasoning_content` (agent_rl/openai/reasoning.py):
    qwen3 for `<think>...</think>`. The trajectory keeps the sampled reasoning tokens either way."""
    mcp_servers: tuple[McpServerConfig, ...] = ()
    """Passed to the entrypoint as `mcp_servers={name: url}` (e.g. `- {name: sandbox}`: the episode's sandbox
    as an MCP server; `- {name: search, url: "http://..."}`: a server of your own). Needs `agent-rl[mcp]`."""

    @field_validator("mcp_servers")
    @classmethod
    def _unique_names(cls, v: tuple[McpServerConfig, ...]) -> tuple[McpServerConfig, ...]:
        names = [s.name for s in v]
        if len(set(names)) != len(names):
            raise ValueError(f"MCP server names must be unique, got {names}")
        return v

    @field_validator("import_path")
    @classmethod
    def _async_entrypoint(cls, v: str, info: ValidationInfo) -> str:
        import inspect

        if ":" not in v:
            raise ValueError(f"{v!r}: expected 'package.module:function'")
        if not inspect.iscoroutinefunction(load_callable(v, near=(info.context or {}).get("path"))):
            raise ValueError(f"{v!r} must be an async function (async def run(task, client, sandbox): ...)")
        return v


class ExternalConfig(Strict):
    """`type: external`: agents in other processes or machines claim this env's tasks from the training run
    over HTTP (`POST /tasks/claim` on the run's gateway), sample through its session URL, and close the session
    with a reward or a final answer (scored by `reward`). agent_rl/gateway/external.py; README, "External agents"."""

    host: str = "127.0.0.1"
    """Where the run's gateway listens (0.0.0.0 to take agents from other machines)."""
    port: int = Field(0, ge=0, le=65535)
    """0: a free port (printed when the run starts)."""
    timeout_s: float = Field(600.0, gt=0)
    """An episode whose task is not claimed and closed within this long ends as an error (re-sampled)."""
    tool_parser: Literal["hermes", "qwen", "llama3_json", "none"] = "hermes"
    """As `agent.tool_parser`."""
    reasoning_parser: Literal["qwen3", "none"] = "none"
    """As `agent.reasoning_parser`."""


VERIFIERS_INSTALL = (
    "verifiers environments need verifiers: `make verifiers` (a venv of its own: verifiers 0.4 pins openai<3, the "
    "agent frameworks need openai>=3), or pip install 'agent-rl[verifiers]' in a venv without agent-rl[frameworks]"
)


def env_config(raw: dict[str, Any]) -> Any:
    """verifiers' validated env config for the YAML's `verifiers.env` (imports the taskset)."""
    try:
        from verifiers.v1.utils.loaders import resolve_env_config
    except ModuleNotFoundError as e:
        raise ValueError(VERIFIERS_INSTALL) from e
    try:
        return resolve_env_config(raw)
    except Exception as e:  # pydantic's ValidationError, or the taskset module that does not import
        raise ValueError(f"verifiers rejected env {raw}: {str(e).splitlines()[0]}") from None


class VerifiersSplit(Strict):
    skip: int = Field(0, ge=0)
    """Tasks of the taskset's `load()` order to leave out first."""
    limit: int | None = Field(None, ge=1)


class HarborConfig(Strict):
    """`type: harbor`: Harbor-format tasks (envs/harbor/), each episode in a fresh container of its task's image."""

    tasks: str
    """A task directory or a directory of tasks; relative to the env YAML."""
    heldout_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    """Tasks held out for evaluation (split `test`), chosen by a stable hash of each task's name."""
    docker_host: str | None = None
    """The Docker engine; default DOCKER_HOST's."""
    warm_containers: int = Field(2, ge=0)
    """Containers per task image started ahead of need."""
    allow_network: bool = False
    """Give network to the containers of tasks that allow it (by default no container has any)."""
    command_timeout_s: float = Field(120.0, gt=0)
    """One command's limit (within the task's agent timeout_sec, which bounds their sum)."""
    parallel_commands: int | None = Field(None, ge=1)
    """Agent commands and verifiers running at once in one event loop's containers (the others wait their turn;
    starting and removing containers is not limited). Default: twice this machine's cores (the containers run on
    its engine): 32 pytest runs at once on 2 cores took past the verifier's 60 s limit at load 40."""

    def resolved_tasks(self, source_path: str | None) -> Path:
        path = Path(self.tasks).expanduser()
        return (
            path if path.is_absolute() or source_path is None else (Path(source_path).parent / path).resolve()
        )


class VerifiersConfig(Strict):
    """`type: verifiers`: a `verifiers` (0.4) environment: its taskset is the data, its harness runs each episode
    (the model calls go through the run's recording gateway), its rewards are the reward (envs/verifiers_env.py)."""

    env: dict[str, Any]
    """verifiers' env config, as its TOML takes it, e.g. `{taskset: {id: my_taskset_module, ...}, agent: {harness:
    {id: "null"}, runtime: {type: subprocess}}}`; validated by verifiers when the env loads."""
    splits: dict[str, VerifiersSplit] = {"train": VerifiersSplit()}
    """Split name -> a slice of the taskset (verifiers tasksets have no splits of their own)."""
    model: str = "policy"
    """The model name the harness sends (the gateway serves the policy under any name)."""
    tool_parser: Literal["hermes", "qwen", "llama3_json", "none"] = "hermes"
    """As `agent.tool_parser`."""
    reasoning_parser: Literal["qwen3", "none"] = "none"
    """As `agent.reasoning_parser`."""

    @model_validator(mode="after")
    def _loads(self) -> VerifiersConfig:
        env_config(self.env)  # import the taskset and validate the config now, with a one-line error
        return self


def project_of(path: str | Path) -> Path | None:
    """The project a file belongs to: the nearest directory above it holding pyproject.toml or .git."""
    for d in Path(path).resolve().parents:
        if (d / "pyproject.toml").is_file() or (d / ".git").exists():
            return d
    return None


def load_callable(import_path: str, near: str | Path | None = None) -> Any:
    """Import `package.module:function` from sys.path, else from the project of `near` (the env file that
    names it; see project_of), which then joins sys.path: `examples.arith_agent.agent:run` in a checkout's
    env resolves from any working directory. Errors name the path."""
    module, _, name = import_path.partition(":")
    try:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            root = project_of(near) if near is not None else None
            missing_is_ours = e.name is not None and (module + ".").startswith(e.name + ".")
            if root is None or not missing_is_ours or str(root) in sys.path:
                raise
            sys.path.append(str(root))  # after everything already on sys.path: installed packages win
            try:
                mod = importlib.import_module(module)
            except ImportError:
                sys.path.remove(str(root))
                raise
        fn = getattr(mod, name)
    except (ImportError, AttributeError) as e:
        where = (
            f" (looked on sys.path and in {project_of(near)})"
            if near is not None and project_of(near)
            else ""
        )
        raise ValueError(f"cannot import {import_path!r}: {e}{where}") from None
    if not callable(fn):
        raise ValueError(f"{import_path!r} is not callable")
    return fn


class EnvSpec(Strict):
    name: str
    type: Literal["simple-tir", "agent", "external", "verifiers", "harbor"] = "simple-tir"
    """simple-tir: the model's turns are parsed for fenced code (tool:); agent: an OpenAI-client agent (agent:)
    runs the episode through the recording gateway; turns: then budgets its chat completions."""
    data: DataConfig | None = Field(None, validate_default=True)
    """Required except for `type: verifiers` (its taskset is the data)."""
    prompt: PromptConfig = PromptConfig()
    tool: ToolConfig = ToolConfig()
    turns: TurnConfig = TurnConfig()
    sandbox: SandboxConfig = SandboxConfig()
    reward: RewardConfig = RewardConfig()
    group_size: int = Field(8, ge=1)
    """n samples per prompt."""
    agent: AgentConfig | None = None
    external: ExternalConfig | None = None
    verifiers: VerifiersConfig | None = None
    harbor: HarborConfig | None = None
    """type: harbor only: the task suite and its containers."""
    """type: external only; turns: budgets each episode's chat completions as for agents."""
    """type: agent only. turns.max_turns caps chat completions per episode, max_tokens_per_turn each one's
    max_tokens, max_response_tokens the episode's sampled tokens."""
    source_path: str | None = None
    """Set by envs.load: the YAML file (resolves data.root, shows up in errors)."""

    @field_validator("data")
    @classmethod
    def _data_required(cls, v: DataConfig | None, info: ValidationInfo) -> DataConfig | None:
        if v is None and info.data.get("type") not in ("verifiers", "harbor"):
            raise PydanticCustomError("missing", "Field required")
        return v

    @field_validator("source_path")
    @classmethod
    def _not_from_yaml(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("source_path is set by envs.load; remove it from the YAML")
        return v

    @model_validator(mode="after")
    def _agent_section(self) -> EnvSpec:
        if (self.type == "agent") != (self.agent is not None):
            raise ValueError(
                "type: agent needs an agent: section (import_path: 'package.module:run'), and only it has one"
            )
        if (self.type == "external") != (self.external is not None):
            raise ValueError(
                "type: external needs an external: section (e.g. {port: 8900}), and only it has one"
            )
        if (self.type == "verifiers") != (self.verifiers is not None):
            raise ValueError(
                "type: verifiers needs a verifiers: section ({env: {taskset: {id: ...}}}), and only it has one"
            )
        if (self.type == "harbor") != (self.harbor is not None):
            raise ValueError("type: harbor needs a harbor: section ({tasks: DIR}), and only it has one")
        if self.type == "harbor" and self.data is not None:
            raise ValueError("type: harbor takes its tasks from harbor.tasks: remove data:")
        if self.type == "verifiers" and self.data is not None:
            raise ValueError("type: verifiers takes its data from the taskset: remove data:")
        return self

    def data_root(self) -> Path:
        assert self.data is not None
        return self.data.resolved_root(Path(self.source_path) if self.source_path else None)

    def __hash__(self) -> int:
        return hash(self.model_dump_json())


def load(path: str | Path) -> EnvSpec:
    """Read and validate an environment YAML; raise envs.yamlio.ConfigError with file:line:field messages."""
    from envs.yamlio import read_yaml

    path = Path(path)
    data, _ = read_yaml(path)
    raw = data.get("data") if isinstance(data, dict) else None
    raw_root = raw.get("root") if isinstance(raw, dict) else None
    root = resolve_root(raw_root, path) if raw_root is None or isinstance(raw_root, str) else None
    spec = load_model(path, EnvSpec, context={"data_root": root})
    return spec.model_copy(update={"source_path": str(path)})
