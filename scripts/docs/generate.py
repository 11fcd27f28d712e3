"""Write (or check) every generated part of the docs: the reference pages and the blocks made of results.

    .venv/bin/python -m scripts.docs.generate          # rewrite them
    .venv/bin/python -m scripts.docs.generate --check  # exit 1, naming each stale file, if one differs

What it writes:
- docs/reference/cli.md, recipe.md, env.md: from the argparse parsers and the pydantic models
  (scripts/docs/cli_reference.py, scripts/docs/recipe_reference.py);
- every block between `<!-- BEGIN generated: NAME -->` and `<!-- END generated: NAME -->` in README.md and in the
  pages under docs/ (docs/_incoming/ aside): the function NAME of scripts/docs/figures.py, from the results files.
Run it after changing a parser, a recipe field or a results file; `make docs` and the tests fail until then.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from scripts.docs import figures

ROOT = figures.ROOT
DOCS = ROOT / "docs"
BLOCK = re.compile(r"(<!-- BEGIN generated: (\w+) -->\n)(.*?)(<!-- END generated: \2 -->)", re.S)


def reference_pages() -> dict[Path, Callable[[], str]]:
    from scripts.docs import cli_reference, recipe_reference

    return {
        DOCS / "reference" / "cli.md": cli_reference.markdown,
        DOCS / "reference" / "recipe.md": recipe_reference.markdown,
        DOCS / "reference" / "env.md": recipe_reference.env_markdown,
    }


def pages_with_blocks() -> list[Path]:
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [p for p in pages if "_incoming" not in p.parts and BLOCK.search(p.read_text())]


def fill(text: str, where: Path) -> str:
    """`text` with every generated block written anew from the results files."""
    docs = "docs/" if where == ROOT / "README.md" else ""

    def one(m: re.Match) -> str:
        name = m[2]
        if name not in figures.GENERATED:
            raise SystemExit(
                f"{where.relative_to(ROOT)}: no function {name!r} in scripts/docs/figures.py "
                f"(known: {', '.join(figures.GENERATED)})"
            )
        return f"{m[1]}{figures.GENERATED[name](docs).rstrip()}\n{m[4]}"

    return BLOCK.sub(one, text)


def expected() -> dict[Path, str]:
    """Every generated file's content as it should be now."""
    out = {path: make() for path, make in reference_pages().items()}
    for page in pages_with_blocks():
        out[page] = fill(page.read_text(), page)
    return out


def stale() -> list[str]:
    return [
        str(p.relative_to(ROOT)) for p, text in expected().items() if not p.is_file() or p.read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.docs.generate", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only check; exit 1 if a generated file is stale")
    args = p.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"{name}: stale; run .venv/bin/python -m scripts.docs.generate")
        return 1 if names else 0
    for path, text in expected().items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
