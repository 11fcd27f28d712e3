"""The embedded default backend: warm bubblewrap sandboxes, each holding a fork-server.

Each sandbox has fresh pid/net/ipc/uts/mount namespaces, a read-only root made of /usr and
the host Python's directories (so the venv's numpy imports), a private size-capped tmpfs
/tmp, and runs code as uid 65534 with no capabilities and no_new_privs. Run as root, bwrap
sets up the namespaces with real privileges (it can bind directories an unprivileged user
cannot traverse, such as a pyenv under /root) and the fork-server drops to uid 65534 before
it reads any request; run as another user, bwrap uses a user namespace instead.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from sandboxes.api import Limits, MiB, SandboxError
from sandboxes.cgroup import SandboxCgroup
from sandboxes.seccomp import filter_bpf
from sandboxes.worker import FORKSERVER_PATH, INSIDE_FORKSERVER, Transport, Worker

NOBODY = 65534
SANDBOX_ENV = {
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    # One thread per numeric library: the sandbox's process cap counts threads too.
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; or run scripts/install_system_deps.sh)"
)


@dataclass(frozen=True)
class LocalOptions:
    """Options of `create("local", ...)` besides pool_size/limits/max_calls."""

    python: str = sys.executable
    """Interpreter to run inside; its prefix and sys.path directories are bound read-only."""
    tmp_bytes: int = 64 * MiB
    """Size of the sandbox's private /tmp."""
    preload: Sequence[str] = ()
    """Modules the fork-server imports once, so calls that import them start faster (e.g. numpy)."""
    ro_binds: Sequence[str] = ()
    """Extra host paths to make visible read-only (same path inside)."""
    cgroups: bool = True
    """Cap memory and processes per sandbox with a cgroup where the host allows it."""
    seccomp: bool = True
    """Load the seccomp filter of `sandboxes.seccomp` (no new namespaces, mounts, bpf, ptrace, ...)."""
    bwrap: str = "bwrap"
    extra_env: dict[str, str] = field(default_factory=dict)


@cache
def python_paths(python: str) -> tuple[str, ...]:
    """Directories the interpreter needs: its prefixes and sys.path entries that exist."""
    probe = "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path]))"
    try:
        out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SandboxError(f"local sandbox: cannot run python={python!r}: {e}") from e
    dirs = {os.path.realpath(python), os.path.abspath(python)}
    dirs |= {os.path.realpath(p) for p in json.loads(out) if p and os.path.isdir(p)}
    return _minimal_roots(dirs | {os.path.dirname(os.path.abspath(python))})


def _minimal_roots(paths: set[str]) -> tuple[str, ...]:
    """Drop paths under /usr (bound whole) or under another path in the set."""
    roots: list[str] = []
    for p in sorted(paths):
        if p == "/usr" or p.startswith("/usr/") or any(p.startswith(r.rstrip("/") + "/") for r in roots):
            continue
        roots.append(p)
    return tuple(roots)


def system_binds() -> list[str]:
    """bwrap arguments that give a sandbox the host's /usr and its top-level lib/bin links or folders, read-only:
    what runs a host binary, and nothing of /tmp, /home or other mounts that come and go."""
    out = ["--ro-bind", "/usr", "/usr"]
    for top in ("lib", "lib64", "lib32", "bin", "sbin"):
        path = f"/{top}"
        if os.path.islink(path):
            out += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            out += ["--ro-bind", path, path]
    return out


def bwrap_command(opts: LocalOptions, as_root: bool) -> list[str]:
    """The bwrap command line that starts one fork-server sandbox."""
    cmd = [opts.bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    cmd += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1"]
    if as_root:
        # The fork-server needs exactly these two to drop to uid 65534; it does so first thing.
        cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        # --disable-userns: the sandbox cannot make nested user namespaces (the seccomp filter denies
        # them too; as root there is no user namespace to limit, and the filter alone does it).
        cmd += ["--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    # Mounts first, then binds: a host python that lives under /tmp (a CI checkout in a temp dir)
    # must be bound on top of the private /tmp, not hidden by it.
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--perms", "1777", "--size", str(opts.tmp_bytes), "--tmpfs", "/tmp"]
    cmd += ["--perms", "1777", "--size", str(4 * MiB), "--tmpfs", "/dev/shm"]
    cmd += system_binds()
    made: set[str] = set()
    keep: set[str] = set()  # top-level /tmp entries that are host paths: the fork-server must not empty them
    for path in (*python_paths(opts.python), *opts.ro_binds):
        parts = Path(path).parts
        if len(parts) > 2 and parts[1] == "tmp":
            keep.add(parts[2])
        for i in range(2, len(parts)):
            parent = str(Path(*parts[:i]))
            if parent not in made:
                made.add(parent)
                cmd += ["--perms", "0755", "--dir", parent]
        cmd += ["--ro-bind", path, path]
    cmd += ["--perms", "0755", "--dir", os.path.dirname(INSIDE_FORKSERVER)]
    cmd += ["--ro-bind", str(FORKSERVER_PATH), INSIDE_FORKSERVER]
    cmd += ["--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    path_env = f"{os.path.dirname(os.path.abspath(opts.python))}:/usr/local/bin:/usr/bin:/bin"
    for key, value in {**SANDBOX_ENV, "PATH": path_env, **opts.extra_env}.items():
        cmd += ["--setenv", key, value]
    cmd += ["--", opts.python, "-I", "-B", INSIDE_FORKSERVER, "--pidns", "--private-shm", "--workdir", "/tmp"]
    if as_root:
        cmd += ["--drop-uid", str(NOBODY)]
    if opts.preload:
        cmd += ["--preload", ",".join(opts.preload)]
    if keep:
        cmd += ["--keep", ",".join(sorted(keep))]
    if opts.seccomp:
        cmd += ["--seccomp-bpf", base64.b64encode(filter_bpf()).decode()]
    return cmd


async def stop_process(proc: asyncio.subprocess.Process, inner_first: bool = False) -> None:
    """Close the control pipe (the fork-server exits on EOF); kill what is still there after 1 s.

    `inner_first`: kill bwrap's child (pid 1 of the sandbox, taking every sandboxed process with it)
    before bwrap, so that bwrap reaps it and nothing is left as a zombie of the host's init.
    """
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), 1.0)
        return
    except TimeoutError:
        pass
    if inner_first:
        with contextlib.suppress(OSError, ValueError):
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            for pid in children:
                os.kill(int(pid), signal.SIGKILL)
            await asyncio.wait_for(proc.wait(), 1.0)
            return
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()


def probe_command(opts: LocalOptions) -> list[str]:
    """The namespaces a sandbox needs, tried on `true` with the sandbox's own system binds. Not a bind of the
    whole of /: bwrap binds such a tree recursively, and a mount that goes away meanwhile (a container's overlay
    under /tmp as a Docker engine removes it) failed the probe as if namespaces were missing."""
    user = ["--unshare-user"] if os.geteuid() != 0 else []
    return [opts.bwrap, *user, "--unshare-pid", "--unshare-net", *system_binds(), "--dev", "/dev", "true"]


def check_available(opts: LocalOptions) -> None:
    """Fail early, with what to install, if bwrap or namespaces are unusable here."""
    if shutil.which(opts.bwrap) is None:
        raise SandboxError(f"local sandbox: `{opts.bwrap}` not found; {_INSTALL_HINT}")
    if opts.seccomp:
        filter_bpf()  # raises, saying what to install, when libseccomp cannot be loaded
    result = subprocess.run(probe_command(opts), capture_output=True, text=True)
    if result.returncode != 0:
        raise SandboxError(
            f"local sandbox: bwrap cannot create namespaces here ({result.stderr.strip()}); "
            "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or run as root"
        )


async def launch_local(opts: LocalOptions, limits: Limits, startup_timeout_s: float = 30.0) -> Worker:
    """Start one bwrap sandbox with a fork-server inside and wait until it is ready."""
    as_root = os.geteuid() == 0
    cgroup = None
    if as_root and opts.cgroups:
        # The cap covers the whole sandbox: the call, bwrap, the fork-server and session processes.
        cgroup = SandboxCgroup.create(
            memory_bytes=limits.memory_bytes + opts.tmp_bytes + 256 * MiB, pids=limits.processes + 4
        )
    cmd = bwrap_command(opts, as_root)
    if cgroup is None:
        cmd.append("--nproc-rlimit")
    errlog = tempfile.TemporaryFile()  # noqa: SIM115 (bwrap's complaints, read if start fails)
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=errlog,
        preexec_fn=cgroup.join if cgroup else None,
        start_new_session=True,
        limit=1 << 26,
    )
    assert proc.stdin is not None and proc.stdout is not None

    async def kill() -> None:
        await stop_process(proc, inner_first=True)
        if cgroup is not None:
            await asyncio.to_thread(cgroup.remove)

    worker = Worker(Transport(proc.stdout, proc.stdin, kill, f"local[pid {proc.pid}]"))
    try:
        hello = await worker.handshake(startup_timeout_s)
    except SandboxError as e:
        errlog.seek(0)
        raise SandboxError(f"{e}; bwrap said: {errlog.read(4000).decode(errors='replace')}") from e
    finally:
        errlog.close()
    if hello["uid"] != NOBODY or hello.get("seccomp") != opts.seccomp:
        await worker.kill()
        raise SandboxError(
            f"local sandbox: fork-server runs as uid {hello['uid']} with seccomp={hello.get('seccomp')}, "
            f"expected uid {NOBODY} and seccomp={opts.seccomp}"
        )
    return worker
