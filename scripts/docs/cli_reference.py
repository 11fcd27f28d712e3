"""The command-line reference page, written from the argparse parsers themselves.

`agent-rl` builds its own parser for `validate` and `plot` (agent_rl/cli.py: `build_parser`); every other
subcommand is delegated to a module whose `main(argv)` builds its parser and calls `parse_args` first. To read
those parsers without running anything, `parsers()` calls each `main` with `ArgumentParser.parse_args`
replaced by a function that raises with the parser in hand (the parse never happens). scripts/docs/generate.py
writes the page; a stale one fails the docs build and tests/test_readme_figures.py; tests/test_docs_reference.py
checks that every subcommand and flag is on it and that the docs' commands use only flags that exist.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Iterator

WIDTH = 100  # usage lines are wrapped at this width whatever the terminal says


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


@contextlib.contextmanager
def _capturing() -> Iterator[None]:
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> argparse.Namespace:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every `agent-rl` subcommand's parser by name, in the order `agent-rl --help` lists them."""
    from agent_rl import cli

    top = cli.build_parser()
    out: dict[str, argparse.ArgumentParser] = {"": top}
    for name, parser in _subparsers(top).items():
        if name not in cli.DELEGATED:
            out[name] = parser
            continue
        module, func, _ = cli.DELEGATED[name]
        with _capturing():
            try:
                getattr(importlib.import_module(module), func)([])
            except _Captured as c:
                out[name] = c.parser
            else:
                raise RuntimeError(f"{module}.{func} returned without parsing its arguments")
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The one-line help each subcommand has in its parent's listing."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every command line by its full words ('train', 'sandbox serve', 'engines add', ...), nested ones too."""
    out: dict[str, argparse.ArgumentParser] = {}
    for name, parser in parsers().items():
        if not name:
            continue
        out[name] = parser
        for sub, subparser in _subparsers(parser).items():
            out[f"{name} {sub}"] = subparser
    return out


def flags(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings a parser accepts (--help and --debug included: cli.main takes --debug anywhere)."""
    return {s for a in parser._actions for s in a.option_strings} | {"--debug"}


def _usage(parser: argparse.ArgumentParser, prog: str) -> str:
    fmt = argparse.HelpFormatter(prog, width=WIDTH)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return fmt.format_help().strip()


def _default(action: argparse.Action) -> str:
    d = action.default
    flag_only = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)
    if d is None or d is argparse.SUPPRESS or d is False or d == "" or isinstance(action, flag_only):
        return ""
    if d == sys.executable:
        return "the running Python"
    if isinstance(d, (list, tuple)):
        return "`" + " ".join(map(str, d)) + "`" if d else ""
    return f"`{d}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _argument_rows(parser: argparse.ArgumentParser, prog: str) -> list[str]:
    fmt = argparse.HelpFormatter(prog, width=WIDTH)
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if a.option_strings:
            name = ", ".join(f"`{s}`" for s in a.option_strings)
            if a.nargs != 0:
                name += f" `{fmt._format_args(a, fmt._get_default_metavar_for_optional(a))}`"
        else:
            name = f"`{fmt._format_args(a, fmt._get_default_metavar_for_positional(a))}`"
        choices = f" One of: {', '.join(f'`{c}`' for c in a.choices)}." if a.choices else ""
        helptext = fmt._expand_help(a) if a.help else ""
        rows.append(f"| {name} | {_cell(_default(a))} | {_cell(helptext + choices)} |")
    return rows


def _section(parser: argparse.ArgumentParser, words: str, summary: str, level: int) -> list[str]:
    prog = f"agent-rl {words}"
    lines = [f"{'#' * level} `{prog}`", ""]
    described = parser.description or summary
    if described:
        lines += [_cell(described), ""]
    lines += ["```", _usage(parser, prog), "```", ""]
    rows = _argument_rows(parser, prog)
    if rows:
        lines += ["| argument | default | what it does |", "|---|---|---|", *rows, ""]
    helps = _help_of(parser)
    for sub, subparser in _subparsers(parser).items():
        lines += _section(subparser, f"{words} {sub}", helps.get(sub, ""), level + 1)
    return lines


def markdown() -> str:
    all_parsers = parsers()
    top = all_parsers.pop("")
    helps = _help_of(top)
    lines = [
        "# Command line",
        "",
        "Generated from the parsers of `agent-rl` by `python -m scripts.docs.generate` (a test fails when it is stale).",
        "A mistake prints one line and exits 2; `--debug` anywhere on the line (or `AGENT_RL_DEBUG=1`) keeps the",
        "traceback. [The command line guide](../guides/command-line.md) explains the run directory and errors.",
        "",
        "| command | what it does |",
        "|---|---|",
        *[f"| [`agent-rl {n}`](#agent-rl-{n}) | {_cell(helps.get(n, ''))} |" for n in all_parsers],
        "",
    ]
    for name, parser in all_parsers.items():
        lines += _section(parser, name, helps.get(name, ""), 2)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
