"""`agent-rl view RUN_DIR`: the run's recorded trajectories as one self-contained HTML file.

agent-rl view runs/tiny_tir/rl                 # writes runs/tiny_tir/rl/view.html, prints its path
agent-rl view RUN_DIR --steps 10:20 --out F    # only steps 10..19
agent-rl view RUN_DIR --serve [--port 8765]    # also serve it on 127.0.0.1 (e.g. over ssh -L)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agent_rl.viewer.report import build_report


def _steps(text: str) -> range:
    a, sep, b = text.partition(":")
    try:
        if not sep:
            return range(int(a), int(a) + 1)
        return range(int(a) if a else 0, int(b) if b else 1 << 62)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--steps {text!r}: expected N, A:B, A: or :B (step numbers)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="agent-rl view",
        description="Write a self-contained HTML viewer of a run's recorded trajectories (RUN_DIR/trajectories).",
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--out", type=Path, help="output file (default RUN_DIR/view.html)")
    p.add_argument(
        "--steps", type=_steps, metavar="A:B", help="only these steps (python slice, end excluded)"
    )
    p.add_argument("--tokenizer", help="tokenizer directory (default: the one the run trained with)")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 until interrupted")
    p.add_argument("--port", type=int, default=8765)
    args = p.parse_args(argv)
    decode = None
    if args.tokenizer:
        from agent_rl.viewer.report import tokenizer_decoder

        decode = tokenizer_decoder(args.tokenizer)
    try:
        out = build_report(args.run_dir, args.out, steps=args.steps, decode=decode)
    except (FileNotFoundError, ValueError) as e:
        p.error(str(e))
    print(out)
    print(f"open file://{out.resolve()}")
    if out.stat().st_size > 64 << 20:
        print(
            f"note: {out.stat().st_size >> 20} MiB; browsers slow down on pages this big: pick steps with --steps A:B"
        )
    if args.serve:
        _serve(out, args.port)
    return 0


def _serve(page: Path, port: int) -> None:
    import contextlib
    import functools
    import http.server

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(page.parent.resolve()))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving http://127.0.0.1:{port}/{page.name} (Ctrl-C to stop)")
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
