"""Harbor-format tasks: read and validate a task directory, with file:line errors.

A Harbor task (the format of Terminal-Bench 2 and the SWE-style suites that TRL, SkyRL, verifiers and
NeMo-Gym consume) is a directory:

    task.toml              timeouts, resources, network, metadata
    instruction.md         what the agent is asked to do
    environment/Dockerfile the container the agent works in (its build context is environment/)
    tests/test.sh          the verifier: copied to /tests after the agent stops, run from the work dir; it
                           writes the reward to /logs/verifier/reward.txt (a number) or reward.json
                           ({"reward": x, ...}); reward.json wins when both exist
    solution/solve.sh      optional: the reference solution (the "oracle")

Harbor's own package needs Python 3.12 and this project runs on 3.11, so the format is read here directly:
the fields agent-rl acts on are typed and checked, the other fields Harbor defines are accepted and
ignored, and an unknown field is refused (a typo in `timeout_sec` would otherwise silently give the
default). tomllib gives no positions, so a field's line is found by scanning the file's tables.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from envs.types import EnvError


class HarborTaskError(EnvError):
    """A task directory that is not a valid Harbor task; the message names the task, file and line."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _finite_positive(cls: type, v: float | None) -> float | None:
    if v is not None and not (math.isfinite(v) and v > 0):
        raise ValueError(f"must be a finite number of seconds > 0, got {v}")
    return v


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.I)


def size_mb(value: str | int) -> int:
    """'2G', '512M', '1.5GiB' or a number of MB -> MB (Harbor's legacy `memory`/`storage` strings)."""
    if isinstance(value, int):
        return value
    m = _SIZE.match(value)
    if not m:
        raise ValueError(f"size {value!r} is not like '2G' or '512M'")
    scale = {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}[m.group(2).upper()]
    return max(1, round(float(m.group(1)) * scale))


class VerifierSection(_Section):
    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None
    network_mode: Literal["no-network", "public", "allowlist"] | None = None
    allowed_hosts: list[str] | None = None
    # Harbor fields agent-rl does not act on (a separate verifier container, artifact collection).
    environment_mode: Any = None
    environment: Any = None
    collect: Any = None

    check_timeout = field_validator("timeout_sec")(_finite_positive)


class AgentSection(_Section):
    timeout_sec: float | None = None
    user: str | int | None = None
    network_mode: Literal["no-network", "public", "allowlist"] | None = None
    allowed_hosts: list[str] | None = None

    check_timeout = field_validator("timeout_sec")(_finite_positive)


class EnvironmentSection(_Section):
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    memory: str | int | None = None  # legacy spelling of memory_mb ("2G")
    storage: str | int | None = None  # legacy spelling of storage_mb
    gpus: int | None = None
    gpu_types: list[str] | None = None
    network_mode: Literal["no-network", "public", "allowlist"] = "public"
    allowed_hosts: list[str] | None = None
    allow_internet: bool | None = None  # legacy: false means no-network
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    # Harbor fields agent-rl does not act on.
    tpu: Any = None
    mcp_servers: Any = None
    skills_dir: str | None = None
    healthcheck: Any = None

    check_build_timeout = field_validator("build_timeout_sec")(_finite_positive)

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"must be > 0, got {v}")
        return v

    @field_validator("memory_mb", "storage_mb")
    @classmethod
    def _mb(cls, v: int | None) -> int | None:
        if v is not None and v < 16:
            raise ValueError(f"must be at least 16 (MB), got {v}")
        return v

    @field_validator("memory", "storage")
    @classmethod
    def _legacy_size(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            size_mb(v)
        return v


class SolutionSection(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class TaskToml(_Section):
    schema_version: str | None = None
    version: str | None = None  # Harbor 1.0's name for schema_version
    task: dict[str, Any] | None = None  # package info: name, description, authors, keywords
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    source: str | None = None
    steps: Any = None
    multi_step_reward_strategy: Any = None
    artifacts: Any = None


@dataclass(frozen=True)
class Resources:
    """What the task's container may use."""

    cpus: float | None
    memory_mb: int | None
    network: bool
    """The task allows the agent network access (Harbor's default is public). agent-rl grants it only
    where the container pool allows network at all (`harbor.allow_network`), which it does not by default."""


@dataclass(frozen=True)
class HarborTask:
    """One validated task: its files and the settings an episode needs."""

    name: str
    path: Path
    instruction: str
    config: TaskToml
    dockerfile: Path | None
    """environment/Dockerfile; None when `environment.docker_image` names a prebuilt image instead."""
    solution: Path | None
    resources: Resources
    workdir: str

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def verifier_timeout_s(self) -> float:
        return self.config.verifier.timeout_sec

    @property
    def agent_timeout_s(self) -> float | None:
        return self.config.agent.timeout_sec


def line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the key at `loc` (table names, then the key) in TOML text, or of its table."""
    keys = [str(k) for k in loc if not isinstance(k, int)]
    if not keys:
        return None
    table, key = keys[:-1], keys[-1]
    current: list[str] = []
    table_line = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", line)
        if header:
            current = [p.strip().strip('"') for p in header.group(1).split(".")]
            if current == keys:
                table_line = n
            continue
        m = re.match(r'^"?([A-Za-z0-9_-]+)"?\s*=', line)
        if m and m.group(1) == key and current == table:
            return n
        if m and not table and current == [] and m.group(1) == key:
            return n
    return table_line


def _first_error(e: ValidationError, text: str, where: Path) -> str:
    err = e.errors()[0]
    loc = tuple(err["loc"])
    line = line_of(text, loc)
    section = ".".join(str(p) for p in loc[:-1] if not isinstance(p, int))
    field = f"[{section}] {loc[-1]}" if section else str(loc[-1])
    if err["type"] == "extra_forbidden":
        allowed = _allowed_fields(loc[:-1])
        msg = f"unknown field; Harbor's fields here are: {', '.join(allowed)}"
    else:
        msg = err["msg"].removeprefix("Value error, ")
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return f"{where}{f':{line}' if line else ''}: {field}: {msg}{more}"


def _allowed_fields(section: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = TaskToml
    for part in section:
        annotation = model.model_fields[str(part)].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def load_task(path: str | Path) -> HarborTask:
    """Read and check one task directory; HarborTaskError (one line: task, file, line, what to do) if invalid."""
    path = Path(path)
    toml_path = path / "task.toml"
    if not toml_path.is_file():
        raise HarborTaskError(
            f"{toml_path}: missing; a Harbor task directory has task.toml, instruction.md, tests/test.sh"
        )
    text = toml_path.read_text()
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HarborTaskError(f"{toml_path}: not valid TOML: {e}") from None
    try:
        config = TaskToml.model_validate(raw)
    except ValidationError as e:
        raise HarborTaskError(_first_error(e, text, toml_path)) from None
    env = config.environment

    def at(loc: tuple[str, ...], msg: str) -> HarborTaskError:
        line = line_of(text, loc)
        return HarborTaskError(f"{toml_path}{f':{line}' if line else ''}: [{loc[0]}] {loc[-1]}: {msg}")

    if env.os != "linux":
        raise at(
            ("environment", "os"), f"{env.os} containers are not supported; agent-rl runs Linux containers"
        )
    if env.gpus:
        raise at(
            ("environment", "gpus"),
            f"the task asks for {env.gpus} GPU(s); agent-rl's task containers have none",
        )

    instruction_path = path / "instruction.md"
    if not instruction_path.is_file() or not instruction_path.read_text().strip():
        raise HarborTaskError(f"{instruction_path}: missing or empty; it is what the agent is asked to do")
    test_sh = path / "tests" / "test.sh"
    if not test_sh.is_file():
        raise HarborTaskError(
            f"{test_sh}: missing; the verifier runs tests/test.sh and reads /logs/verifier/reward.txt"
        )
    dockerfile = path / "environment" / "Dockerfile"
    if env.docker_image is None and not dockerfile.is_file():
        raise HarborTaskError(
            f"{dockerfile}: missing; give environment/Dockerfile or set [environment] docker_image in task.toml"
        )
    solve = path / "solution" / "solve.sh"
    memory = (
        env.memory_mb
        if env.memory_mb is not None
        else (size_mb(env.memory) if env.memory is not None else None)
    )
    network = env.network_mode != "no-network" and env.allow_internet is not False
    name = (config.task or {}).get("name") or path.name
    return HarborTask(
        name=str(name),
        path=path,
        instruction=instruction_path.read_text(),
        config=config,
        dockerfile=dockerfile if dockerfile.is_file() else None,
        solution=solve if solve.is_file() else None,
        resources=Resources(cpus=env.cpus, memory_mb=memory, network=network),
        workdir=env.workdir or "",
    )


def task_dirs(path: str | Path) -> list[Path]:
    """The task directories under `path`: itself when it holds task.toml, else its children that do."""
    path = Path(path)
    if not path.is_dir():
        raise HarborTaskError(
            f"{path}: not a directory; give a Harbor task directory or a directory of tasks"
        )
    if (path / "task.toml").exists():
        return [path]
    dirs = sorted(p for p in path.iterdir() if p.is_dir() and (p / "task.toml").exists())
    if not dirs:
        raise HarborTaskError(f"{path}: no task.toml in it or in any of its sub-directories")
    return dirs


def load_tasks(path: str | Path) -> list[HarborTask]:
    """Every task under `path`; raises HarborTaskError listing each invalid task, one line each."""
    tasks, errors = [], []
    for d in task_dirs(path):
        try:
            tasks.append(load_task(d))
        except HarborTaskError as e:
            errors.append(str(e))
    if errors:
        raise HarborTaskError("\n".join(errors))
    return tasks


def heldout(name: str, fraction: float) -> bool:
    """Whether a task is held out: a stable hash of its name, so the split survives adding tasks."""
    import hashlib

    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    return h / 2**64 < fraction
