"""The teacher's engines, from `algorithm.teacher.engine`, and the check that its tokenizer is the student's.

- embedded with `model`, placement.topology inprocess: an EmbeddedEngine in the driver (its own engine
  thread), as the default rollout engine is;
- embedded with `model`, topology processes: `count` `agent-rl serve` processes on the engines' cores
  (the teacher is an engine role), reached over SGLang's /generate;
- `urls`: servers someone else started (SGLang's /generate for embedded and sglang, vLLM's
  /v1/completions with prompt_logprobs for vllm).

Teacher engines only score (`score(input_ids, start=, request_id=)`): they never sample for the
rollouts and never take a weight update. The teacher scores the student's token ids, so its
tokenizer must map every id to the same token; a mismatch is refused before step 1, in one line.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent_rl.config import TeacherConfig, TeacherEngineConfig
from agent_rl.engines.api import EngineOptions
from agent_rl.errors import UserError


class Scorer(Protocol):
    """An engine that returns log p(input_ids[t] | input_ids[:t]) for t = start..len-1."""

    async def score(self, input_ids: list[int], *, start: int, request_id: str) -> list[float]: ...


@dataclass
class TeacherEngines:
    """The started (or reached) teacher engines and how to stop what was started here."""

    clients: list[Scorer]
    names: list[str]
    _closers: list[Callable[[], Any]] = field(default_factory=list)

    async def close(self) -> None:
        for close in reversed(self._closers):
            if inspect.isawaitable(result := close()):
                await result


async def start_teacher(
    cfg: TeacherConfig,
    student_tokenizer: Any,
    *,
    max_seq_len: int,
    seed: int,
    cores: Sequence[int] | None = None,
) -> TeacherEngines:
    """Start or reach the teacher's engines and check their tokenizer (call on the rollout loop).

    `cores`: the processes topology's engine cores (the teacher servers are pinned to them); None: the
    teacher runs in this process."""
    eng = cfg.engine
    out = TeacherEngines([], [])
    try:
        if eng.urls:
            out = _reach(eng)
        elif cores is None:
            from agent_rl.engines.embedded.engine import EmbeddedEngine

            assert eng.model is not None  # TeacherEngineConfig requires model or urls
            opts = EngineOptions(eng.max_batch, max_seq_len, eng.dtype)
            for _ in range(eng.count):
                e = EmbeddedEngine(eng.model, opts, seed=seed)
                out.clients.append(e)
                out._closers.append(e.close)
            out.names = [f"teacher {i} (in-process, {eng.model})" for i in range(eng.count)]
        else:
            await _launch(eng, out, max_seq_len=max_seq_len, seed=seed, cores=tuple(cores))
        check_tokenizer(student_tokenizer, await _tokenizer_dir(eng, out.clients))
    except BaseException:
        await out.close()
        raise
    return out


def _reach(eng: TeacherEngineConfig) -> TeacherEngines:
    from agent_rl.engines.client import SGLangClient, VLLMClient

    cls = VLLMClient if eng.type == "vllm" else SGLangClient
    clients = [cls(u) for u in eng.urls]
    return TeacherEngines(list(clients), list(eng.urls), [c.close for c in clients])


async def _launch(
    eng: TeacherEngineConfig, out: TeacherEngines, *, max_seq_len: int, seed: int, cores: tuple[int, ...]
) -> None:
    """`count` `agent-rl serve` processes on `cores` (shared with the rollout engines: the teacher is one of them)."""
    from agent_rl.engines.launch import launch_server

    assert eng.model is not None
    opts = EngineOptions(eng.max_batch, max_seq_len, eng.dtype)
    for i in range(eng.count):
        handle = await asyncio.to_thread(launch_server, eng.model, opts, seed=seed, cores=cores)
        client = handle.client()
        out.clients.append(client)
        out.names.append(f"teacher {i} ({handle.url}, cores {list(cores)})")
        out._closers += [handle.stop, client.close]


async def _tokenizer_dir(eng: TeacherEngineConfig, clients: list[Any]) -> str:
    """The directory holding the teacher's tokenizer: the config's, else what the first server reports."""
    if eng.tokenizer or eng.model:
        return str(eng.tokenizer or eng.model)
    c = clients[0]
    if eng.type == "vllm":
        reported = (await c.request("GET", "/v1/models"))["data"][0].get("root")
    else:
        reported = (await c.request("GET", "/get_model_info")).get("tokenizer_path")
    if not reported or not Path(reported).is_dir():
        raise UserError(
            f"algorithm.teacher.engine: the teacher at {eng.urls[0]} reports its tokenizer at {reported!r}, which "
            "is not a directory here: set algorithm.teacher.engine.tokenizer to a copy of the teacher's tokenizer"
        )
    return str(reported)


def check_tokenizer(student: Any, teacher_dir: str) -> None:
    """Refuse (one line) a teacher whose tokenizer maps any id to another token than the student's does."""
    from transformers import AutoTokenizer

    try:
        teacher = AutoTokenizer.from_pretrained(teacher_dir)
    except (OSError, ValueError) as e:
        raise UserError(
            f"algorithm.teacher.engine: no tokenizer loads from {teacher_dir!r} ({type(e).__name__}): point "
            "algorithm.teacher.engine.tokenizer at the teacher's tokenizer directory"
        ) from None
    s_vocab = {i: t for t, i in student.get_vocab().items()}
    t_vocab = {i: t for t, i in teacher.get_vocab().items()}
    differ = sorted(i for i in s_vocab.keys() | t_vocab.keys() if s_vocab.get(i) != t_vocab.get(i))
    if differ:
        i = differ[0]
        raise UserError(
            f"algorithm.teacher.engine: the teacher's tokenizer ({teacher_dir}) is not the student's: {len(differ)} "
            f"of {max(len(s_vocab), len(t_vocab))} token ids differ (id {i}: student {s_vocab.get(i)!r}, teacher "
            f"{t_vocab.get(i)!r}); the teacher scores the student's token ids, so use a teacher with the "
            "student's tokenizer"
        )
