"""No key in a command line, an error or a printed log: SGLang's launcher (which takes its key on the command line
only) made to fail to start, through the path a run takes (hosts.ServerHost -> engines/launch.py); and the one
redaction helper every printed command goes through.

SGLang cannot run here (no CPU build): a fake `sglang.launch_server` module stands in for it at its process
boundary. Like SGLang it reads `--api-key` from its arguments and logs them (`server_args=ServerArgs(...,
api_key='...')`); it also records what the kernel shows as its command line (/proc/self/cmdline, what `ps` and
other users of the machine see), and it never serves."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from agent_rl import auth
from sandboxes.auth import KEY_ENV

KEY = "run-key-" + "k" * 40
ROOT = Path(__file__).resolve().parents[2]

FAKE = """
import json, os, sys, time
args = sys.argv[1:]
key = args[args.index("--api-key") + 1] if "--api-key" in args else None
cmdline = open("/proc/self/cmdline", "rb").read().decode().split("\\0")
print(f"server_args=ServerArgs(model_path='m', api_key={key!r}, port=1)", flush=True)
print(f"[launcher] starting with --api-key {key}", flush=True)
with open(os.environ["FAKE_SGLANG_RECORD"] + ".tmp", "w") as f:
    json.dump({"argv": args, "cmdline": cmdline}, f)
os.rename(os.environ["FAKE_SGLANG_RECORD"] + ".tmp", os.environ["FAKE_SGLANG_RECORD"])
if os.environ.get("FAKE_SGLANG_EXIT"):
    sys.exit(3)
time.sleep(3600)
"""


@pytest.fixture
def fake_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pkg = tmp_path / "fake" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(FAKE)
    record = tmp_path / "record.json"
    monkeypatch.setenv("PYTHONPATH", f"{pkg.parent}:{ROOT}")
    monkeypatch.setenv("FAKE_SGLANG_RECORD", str(record))
    monkeypatch.setenv("AGENT_RL_NODE_IP", "127.0.0.1")
    monkeypatch.setenv(KEY_ENV, KEY)
    return record


def _start_sglang_host(timeout_s: float) -> Exception:
    """hosts.ServerHost("sglang", ...) as a run's Ray actor makes it (here in-process: no Ray); what it raised."""
    from agent_rl import hosts

    kw = {
        "tp": 1,
        "max_seq_len": 128,
        "dtype": "bfloat16",
        "extra": ("--log-level", "info"),
        "timeout_s": timeout_s,
    }
    with pytest.raises(Exception) as e:
        hosts.ServerHost("sglang", "/models/m", kw, 0, auth.server_env())
    return e.value


def test_sglang_launcher_that_times_out_prints_no_key__sglang_faked_at_its_process_boundary(
    fake_sglang: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    """The launcher's clock jumps past its deadline once the fake has logged its key (an event, not a wait): the
    TimeoutError quotes the command and the log's tail, and neither it nor anything printed holds the key (the
    message hosts.host_server wraps it in, which needs Ray, is built here as it builds it); the fake got the key,
    yet its command line (what `ps` shows) does not hold it."""
    from agent_rl.engines import launch

    def clock() -> float:  # real time until the fake has started and logged, then past any deadline
        return time.monotonic() + (1e9 if fake_sglang.exists() else 0.0)

    monkeypatch.setattr(launch, "time", SimpleNamespace(monotonic=clock, sleep=time.sleep))
    err = _start_sglang_host(timeout_s=600.0)
    assert isinstance(err, TimeoutError), err
    text = str(err)
    assert "agent_rl.engines.sglang_launch --model-path /models/m" in text  # the command is quoted...
    assert "server_args=ServerArgs(" in text and "api_key='***'" in text  # ...with the log's tail, redacted
    wrapped = auth.redact(f"sglang server for engine failed to start: {err}")  # what hosts.host_server raises
    recorded = json.loads(fake_sglang.read_text())
    assert recorded["argv"][-2:] == ["--api-key", KEY]  # SGLang got its key...
    assert not any(KEY in part for part in recorded["cmdline"])  # ...through no command line
    out, errs = capfd.readouterr()
    for where in (text, wrapped, out, errs):
        assert KEY not in where


def test_sglang_launcher_that_exits_prints_no_key__sglang_faked_at_its_process_boundary(
    fake_sglang: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("FAKE_SGLANG_EXIT", "1")
    err = _start_sglang_host(timeout_s=600.0)
    assert isinstance(err, RuntimeError) and "exited with code 3" in str(err), err
    assert "--api-key ***" in str(err) and KEY not in str(err)
    out, errs = capfd.readouterr()
    assert KEY not in out + errs


@pytest.mark.parametrize(
    "text",
    [
        f"python -m sglang.launch_server --api-key {KEY} --port 1",
        f"--api-key={KEY}",
        f"server_args=ServerArgs(api_key='{KEY}')",
        f"Authorization: Bearer {KEY}",
        f"the key is {KEY} (in a message)",  # the value itself, wherever it stands
    ],
)
def test_redact_removes_the_key_wherever_it_stands(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    out = auth.redact(text)
    assert KEY not in out and "***" in out


def test_redact_knows_a_flag_value_it_was_not_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert auth.redact_command([sys.executable, "-m", "x", "--api-key", "s3cret", "--port", "1"]).endswith(
        "--api-key *** --port 1"
    )


def test_the_ray_start_argument_is_the_only_way_the_key_travels(monkeypatch: pytest.MonkeyPatch) -> None:
    """hosts.py hands the key to a node's ServerHost as a start argument (never Ray's runtime_env, which its
    dashboard shows), and the launcher's command for SGLang holds no key."""
    monkeypatch.setenv(KEY_ENV, KEY)
    assert auth.server_env()[KEY_ENV] == KEY
    seen: list[list[str]] = []
    from agent_rl.engines import launch

    monkeypatch.setattr(launch, "start_server", lambda cmd, *a, **k: seen.append(cmd))
    launch.launch_sglang("/m", host="127.0.0.1", tp=1, max_seq_len=8, dtype="bfloat16", seed=0)
    assert seen and not any(KEY in part for part in seen[0]) and "--api-key" not in seen[0]
