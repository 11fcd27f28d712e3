"""`agent-rl data pull [NAME...]`: fetch the GPU recipes' data sets from their public sources.

Each file is pinned to a repository, a commit and a sha256 (the SOURCE.txt of each set in the
project's data snapshot). A download is checked against its sha256 before it is moved into the
cache, so a wrong or truncated file never reaches a loader. The cache is `$AGENT_RL_DATA`, else
`~/.cache/agent-rl/data` (`$XDG_CACHE_HOME` respected), laid out as the loaders read it; the
loaders look there when ../shared/data is not beside the checkout. After a set is in place its
loader runs once and prints what it fixes (form feeds restored to `\\frac`, padded answers,
duplicates), the same report a training run logs.

    agent-rl data pull                 # every set
    agent-rl data pull gsm8k aime2025  # some
    agent-rl data list                 # names, files, whether cached
"""

from __future__ import annotations

import hashlib
import os
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from agent_rl.errors import UserError

RAW_URL = "https://raw.githubusercontent.com"  # {base}/{repo}/{commit}/{path}
LFS_URL = "https://media.githubusercontent.com/media"  # the same layout, for files kept in Git LFS
URL_ENV_VAR = "AGENT_RL_DATA_URL"  # another base with the same layout (a mirror; the tests' local server)
LFS_POINTER = b"version https://git-lfs"


@dataclass(frozen=True)
class SourceFile:
    """One file of a data set: where it lives upstream, pinned, and its checksum."""

    local: str  # path under the data root, as the loaders read it
    repo: str  # owner/name on GitHub
    commit: str
    path: str  # inside the repository
    sha256: str


@dataclass(frozen=True)
class DataSet:
    name: str  # the env YAML's `data.splits.*.dataset`
    files: tuple[SourceFile, ...]
    parts: tuple[str, ...] = ("test",)  # the parts its loader knows (gsm8k and countdown have train and test)


SIMPLETIR = ("ltzheng/SimpleTIR", "e7b5b4430fe266f0cb3b32c65ef2791bca8a2afe")
SVS = ("MasterVito/SvS", "9fd8f35375b31b8632b52e715296c264a3ad4176")
GSM8K = ("openai/grade-school-math", "3101c7d5072418e28b9008a6636bde82a006892c")
UFT = ("liumy2010/UFT", "ad3c8ec7d258d4e4cf3f359dd75925d0f127a520")
SIMPLERL = ("hkust-nlp/simpleRL-reason", "cf1c7858bfc145a27aa733e75d930d34f0d318a6")

# The files the loaders in envs/datasets.py read, as the SOURCE.txt files pin them.
DATASETS: dict[str, DataSet] = {
    d.name: d
    for d in (
        DataSet("aime2024", (SourceFile("aime2024/simpletir_aime.parquet", *SIMPLETIR, "datasets/deepscaler/aime.parquet", "324b59b4a9134735057635c4f4973cd6a25be8ea11720d46673f2b9f28bf3e79"),)),
        DataSet("aime2025", (SourceFile("aime2025/simpletir_aime25.parquet", *SIMPLETIR, "datasets/deepscaler/aime25.parquet", "6afa92a6639609c46fecba23b365144cc6186e8e818be1ed0cf475423405fda7"),)),
        DataSet("math500", (SourceFile("math500/simplerl_math500_test.jsonl", *SIMPLERL, "examples/simplelr_math_eval/data/math500/test.jsonl", "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"),)),
        DataSet("simplelr_math_35", (SourceFile("simplelr_math_lvl3to5_train/simpletir_simplelr_math_35_train.parquet", *SIMPLETIR, "datasets/simplelr_math_35/train.parquet", "02900ef03ea93079734734069cda7c4230855eab104c450948c05b5a96941a54"),)),
        DataSet("dapo_math_17k", (SourceFile("dapo_math_17k/svs_dapo_math_17k.parquet", *SVS, "data/dapo_math_17k.parquet", "246ae23df97c9eae8126cb4da780e9a0a31d10110e16eed144bcecbf2132d535"),)),
        DataSet("gsm8k", (
            SourceFile("gsm8k/train.jsonl", *GSM8K, "grade_school_math/data/train.jsonl", "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465"),
            SourceFile("gsm8k/test.jsonl", *GSM8K, "grade_school_math/data/test.jsonl", "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14"),
        ), parts=("train", "test")),
        DataSet("countdown", (
            SourceFile("countdown/uft_train.parquet", *UFT, "data/countdown/train.parquet", "33f346623a744da8ea00305e6a9b8a46d452354251f166bfcf30589db1909045"),
            SourceFile("countdown/uft_test.parquet", *UFT, "data/countdown/test.parquet", "aef0cbfc076b527d3b89f7c14a679bd0c8426a4294285b78366df5b49d9dcd02"),
        ), parts=("train", "test")),
    )
}  # fmt: skip


def cache_dir() -> Path:
    """Where `pull` writes: $AGENT_RL_DATA, else ~/.cache/agent-rl/data."""
    from envs.spec import DATA_ENV_VAR, default_cache_root

    env = os.environ.get(DATA_ENV_VAR)
    return Path(env).expanduser() if env else default_cache_root()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_cached(f: SourceFile, root: Path) -> bool:
    path = root / f.local
    return path.is_file() and sha256_of(path) == f.sha256


def _fetch(url: str, dest: Path, timeout_s: float) -> None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r, dest.open("wb") as out:
            while block := r.read(1 << 20):
                out.write(block)
    except urllib.error.HTTPError as e:
        raise UserError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(
            f"{url}: cannot download ({reason}); check the network, or set ${URL_ENV_VAR} to a mirror "
            "with the same {repo}/{commit}/{path} layout"
        ) from None


def download(f: SourceFile, root: Path, *, base: str | None = None, timeout_s: float = 60.0) -> Path:
    """Fetch one file into `root`, verify its sha256, then move it into place (never a partial file).

    A Git LFS pointer from the raw URL is followed to GitHub's LFS media URL."""
    dest = root / f.local
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    url = f"{(base or os.environ.get(URL_ENV_VAR) or RAW_URL).rstrip('/')}/{f.repo}/{f.commit}/{f.path}"
    try:
        _fetch(url, tmp, timeout_s)
        if base is None and not os.environ.get(URL_ENV_VAR) and tmp.read_bytes()[:64].startswith(LFS_POINTER):
            url = f"{LFS_URL}/{f.repo}/{f.commit}/{f.path}"
            _fetch(url, tmp, timeout_s)
        got = sha256_of(tmp)
        if got != f.sha256:
            raise UserError(
                f"{url}: sha256 {got} does not match the pinned {f.sha256} ({f.local}); the file was not "
                "kept. Upstream changed or the download was corrupted: try again, or report it"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def pull(names: list[str], root: Path, *, base: str | None = None, report: bool = True) -> list[Path]:
    """Fetch every file of the named sets that is not already cached (checked by sha256); return the paths."""
    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise UserError(f"unknown data set(s) {', '.join(unknown)}: choose from {', '.join(DATASETS)}")
    out = []
    for name in names or list(DATASETS):
        for f in DATASETS[name].files:
            if is_cached(f, root):
                print(f"{f.local}: cached (sha256 ok)", file=sys.stderr)
            else:
                print(f"{f.local}: downloading {f.repo}@{f.commit[:8]}:{f.path}", file=sys.stderr)
                download(f, root, base=base)
            out.append(root / f.local)
        if report:
            for line in fix_report(DATASETS[name], root):
                print(f"  {line}", file=sys.stderr)
    return out


def fix_report(ds: DataSet, root: Path) -> list[str]:
    """Run the set's loader once per part: what it fixes and drops (`DatasetReport.summary`)."""
    from envs.datasets import load_split
    from envs.spec import DataSource

    return [load_split(DataSource(dataset=ds.name, part=part), root)[1].summary() for part in ds.parts]


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="agent-rl data", description="Data sets of the GPU recipes.")
    sub = p.add_subparsers(dest="action", required=True)
    pl = sub.add_parser("pull", help="download, verify (sha256) and cache data sets")
    pl.add_argument("names", nargs="*", metavar="NAME", help=f"default: all ({', '.join(DATASETS)})")
    pl.add_argument(
        "--root", type=Path, help="cache directory (default: $AGENT_RL_DATA or ~/.cache/agent-rl/data)"
    )
    pl.add_argument(
        "--base-url", help=f"a mirror with the {{repo}}/{{commit}}/{{path}} layout (or ${URL_ENV_VAR})"
    )
    sub.add_parser("list", help="the data sets, their files and whether they are cached")
    args = p.parse_args(argv)
    if args.action == "list":
        root = cache_dir()
        for ds in DATASETS.values():
            for f in ds.files:
                state = "cached" if is_cached(f, root) else "missing"
                print(f"{ds.name:18s} {f.local:70s} {state}")
        print(f"cache: {root}")
        return 0
    root = args.root or cache_dir()
    pull(args.names, root, base=args.base_url)
    print(root)
    return 0
