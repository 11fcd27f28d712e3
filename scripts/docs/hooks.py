"""MkDocs hooks (mkdocs.yml `hooks:`): the site's home page, the included results files and a freshness check.

- The build stops when a generated file is stale (the reference pages, the README's and the pages' generated
  blocks: scripts/docs/generate.py) and says to run `python -m scripts.docs.generate`.
- index.md is README.md itself, its `docs/` links made relative to the site.
- A line `[results: benchmarks/results/NAME.md](RELATIVE/PATH)` on its own (a working link on GitHub) becomes
  that results file, as its benchmark's report step wrote it, with its headings one level down. A link to a
  file that does not exist, or whose path does not lead to it from the page, stops the build.
- Images under benchmarks/results/ are published as results/... and the pages' links to them rewritten.
- Any other link from a page to a Markdown file of the repository outside docs/ (a results file named in a
  sentence, say) is a working link on GitHub but no page of the site: on the site it becomes the file's path in
  code, and a link to a file that does not exist stops the build. Every other link is left to MkDocs' strict
  validation (mkdocs.yml `validation:`), which `make docs` does not silence (no --quiet).
"""

from __future__ import annotations

import os
import posixpath
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = re.compile(r"^\[results: (benchmarks/results/\S+\.md)\]\((\S+)\)$", re.M)
IMAGE = re.compile(r"(!\[[^\]]*\]\()(\S+?\.png)\)")
README_LINK = re.compile(r"\]\(docs/")
REPO_MD_LINK = re.compile(r"\[([^\]]+)\]\(((?:\.\./)+[\w./-]+\.md)\)")


def _path() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def include(rel: str, link: str, page: str) -> str:
    """A results file's Markdown with its headings one level down (the page keeps its own title)."""
    path = ROOT / rel
    if not path.is_file():
        raise SystemExit(f"docs/{page}: [results: {rel}]: no such file")
    via = (ROOT / "docs" / posixpath.dirname(page) / link).resolve()
    if via != path.resolve():
        raise SystemExit(f"docs/{page}: [results: {rel}]({link}): the link leads to {via}, not to {rel}")
    out, fence = [], False
    for line in path.read_text().splitlines():
        if line.startswith(("```", "~~~")):
            fence = not fence
        out.append("#" + line if not fence and re.match(r"#{1,5} ", line) else line)
    return "\n".join(out)


def site_image(link: str, page: str) -> str:
    """A link to a PNG under benchmarks/results/ (relative to the page's file) as the link to its site copy."""
    target = (ROOT / "docs" / posixpath.dirname(page) / link).resolve()
    results = (ROOT / "benchmarks" / "results").resolve()
    if results not in target.parents:
        return link
    site = "results/" + target.relative_to(results).as_posix()
    return os.path.relpath(site, posixpath.dirname(page) or ".").replace(os.sep, "/")


def repo_path(text: str, link: str, page: str) -> str:
    """A link from docs/PAGE to a Markdown file of the repository outside docs/: that file's path in code (the link
    itself where it stays inside docs/, for MkDocs to check)."""
    target = (ROOT / "docs" / posixpath.dirname(page) / link).resolve()
    docs = (ROOT / "docs").resolve()
    if docs == target or docs in target.parents:
        return f"[{text}]({link})"
    if not target.is_file():
        raise SystemExit(f"docs/{page}: [{text}]({link}): no such file {target.relative_to(ROOT.resolve())}")
    rel = target.relative_to(ROOT.resolve()).as_posix()
    return f"`{rel}`" if text.removeprefix("results: ") == rel else f"{text} (`{rel}`)"


def expand(markdown: str, page: str) -> str:
    markdown = INCLUDE.sub(lambda m: include(m[1], m[2], page), markdown)
    markdown = REPO_MD_LINK.sub(lambda m: repo_path(m[1], m[2], page), markdown)
    return IMAGE.sub(lambda m: f"{m[1]}{site_image(m[2], page)})", markdown)


def on_pre_build(config):  # noqa: ANN001, ANN201 (MkDocs' hook signature)
    _path()
    from scripts.docs import generate

    names = generate.stale()
    if names:
        raise SystemExit(
            f"stale generated docs: {', '.join(names)}; run .venv/bin/python -m scripts.docs.generate"
        )


def on_files(files, config):  # noqa: ANN001, ANN201
    from mkdocs.structure.files import File

    files.append(
        File.generated(config, "index.md", content=README_LINK.sub("](", (ROOT / "README.md").read_text()))
    )
    results = ROOT / "benchmarks"
    for png in sorted((results / "results").rglob("*.png")):
        files.append(
            File(
                png.relative_to(results).as_posix(),
                src_dir=str(results),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files


def on_page_markdown(markdown, page, config, files):  # noqa: ANN001, ANN201
    return expand(markdown, page.file.src_uri)
