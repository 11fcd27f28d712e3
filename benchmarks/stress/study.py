"""The study file's schema (`benchmarks/stress/grid.yaml`): blocks of cells, validated once and frozen.

Its own module so that the grid runner (grid.py) and the report (report.py) both import it
and neither imports the other.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from benchmarks.stress.run import METHODS, RunConfig


class Block(BaseModel):
    """A rectangle of cells: every method x lag x lr listed here."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    methods: tuple[str, ...]
    lags: tuple[int, ...]
    lrs: tuple[float, ...]
    opob_mode: str | None = Field(None, pattern="^(exact|proxy)$")
    """Overrides the study's OPOB mode for this block (e.g. an exact-gradient check of VCPO)."""
    seeds: int | None = Field(None, ge=1)
    """Overrides the study's seed count for this block."""

    @field_validator("methods")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in v if m not in METHODS]
        if unknown:
            raise ValueError(f"unknown methods {unknown}; expected some of {sorted(METHODS)}")
        return v

    @field_validator("lags")
    @classmethod
    def _lags(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(k < 0 for k in v):
            raise ValueError(f"lags must be >= 0, got {list(v)}")
        return v

    @field_validator("lrs")
    @classmethod
    def _lrs(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not lr > 0 for lr in v):
            raise ValueError(f"learning rates must be > 0, got {list(v)}")
        return v


class StudyConfig(BaseModel):
    """The grid file (not an agent-rl training recipe)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    reference_lr: float = Field(..., gt=0)
    """The lr whose tables are the headline (sync's fastest stable rate); k* is measured there."""
    seeds: int = Field(5, ge=1)
    steps: int = Field(250, ge=1)
    batch_prompts: int = Field(16, ge=1)
    group_size: int = Field(8, ge=2)
    eval_every: int = Field(10, ge=1)
    opob_mode: str = Field("proxy", pattern="^(exact|proxy)$")
    workers: int = Field(2, ge=1)
    out: str = "benchmarks/results/stress"
    blocks: tuple[Block, ...]

    def cells(self) -> list[RunConfig]:
        """Every run, in the order they are started: block by block, and within a block seed by
        seed, so a grid cut short has whole seed waves of the first blocks."""
        seen: dict[tuple, RunConfig] = {}
        for b in self.blocks:
            for seed in range(b.seeds or self.seeds):
                for lr in b.lrs:
                    for method in b.methods:
                        for lag in sorted(b.lags, reverse=True):
                            cfg = RunConfig(
                                method=method, lag=lag, lr=lr, seed=seed, steps=self.steps,
                                batch_prompts=self.batch_prompts, group_size=self.group_size,
                                eval_every=self.eval_every, opob_mode=b.opob_mode or self.opob_mode,
                            )  # fmt: skip
                            seen.setdefault(cell_key(cfg), cfg)
        return list(seen.values())


def cell_key(cfg: RunConfig) -> tuple:
    return (
        cfg.method,
        cfg.lag,
        cfg.lr,
        cfg.seed,
        cfg.steps,
        cfg.batch_prompts,
        cfg.group_size,
        cfg.opob_mode,
    )
