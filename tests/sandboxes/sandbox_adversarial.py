"""Adversarial cases shared by the local and docker test files.

Each case runs hostile code through a sandbox, asserts it was contained, and then asserts the
sandbox still serves a normal call. Cases assume pool_size=1 so consecutive calls hit the same
warm sandbox (the strictest setting for leaks between calls). A probe that checks something is absent
from its output also checks that it ran to its end, so a probe that crashes fails its case.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from sandboxes import ExecResult, Limits, Sandbox

HOST_TMP_ENTRIES = {
    p.parts[2]
    for p in map(Path, {sys.prefix, sys.base_prefix, os.path.realpath(sys.executable)})
    if len(p.parts) > 2 and p.parts[1] == "tmp"
}

FAKE_SECRET = "agent-rl-fake-secret-7f3a9c"

Case = Callable[[Sandbox], Awaitable[None]]
CASES: list[Case] = []


def case(fn: Case) -> Case:
    CASES.append(fn)
    return fn


async def still_works(sb: Sandbox) -> None:
    result = await sb.run("print(6 * 7)")
    assert (result.stdout, result.exit_code) == ("42\n", 0), result


async def process_count(sb: Sandbox) -> int:
    result = await sb.run("import os; print(sum(p.isdigit() for p in os.listdir('/proc')))")
    assert result.exit_code == 0, result
    return int(result.stdout)


@case
async def host_tcp_listener_is_unreachable(sb: Sandbox) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        code = (
            "import socket\ns = socket.socket(); s.settimeout(2)\n"
            f"try:\n    s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
            "except OSError as e:\n    print('refused', e)\n"
        )
        result = await sb.run(code)
        assert "CONNECTED" not in result.stdout, result
        assert result.exit_code == 0 and result.stdout.startswith("refused"), (
            result
        )  # the probe ran to its end
        try:
            listener.accept()
            raise AssertionError("the host listener accepted a connection from the sandbox")
        except BlockingIOError:
            pass
    finally:
        listener.close()
    await still_works(sb)


@case
async def outside_address_is_unreachable(sb: Sandbox) -> None:
    code = (
        "import socket\nfor addr in [('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    try:\n        s.connect(addr); print('CONNECTED', addr)\n"
        "    except OSError as e:\n        print('blocked', e)\n"
    )
    result = await sb.run(code)
    assert "CONNECTED" not in result.stdout and result.stdout.count("blocked") == 2, result
    await still_works(sb)


@case
async def host_secrets_are_unreadable(sb: Sandbox) -> None:
    code = (
        "import os\n"
        "for path in ['/etc/shadow', '/root/.bash_history', '/var/run/docker.sock', '/run/docker.sock']:\n"
        "    try:\n        open(path, 'rb').read(); print('READ', path)\n"
        "    except OSError as e:\n        print('denied', path, type(e).__name__)\n"
        "try:\n    print('ROOT', sorted(os.listdir('/root')))\nexcept OSError as e:\n    print('denied /root')\n"
    )
    result = await sb.run(code)
    assert "READ" not in result.stdout, result
    lines = result.stdout.splitlines()  # the probe ran to its end: four files tried, then /root
    assert (
        result.exit_code == 0 and len(lines) == 5 and sum(ln.startswith("denied /") for ln in lines[:4]) == 4
    ), result
    root_line = [line for line in result.stdout.splitlines() if line.startswith("ROOT")]
    # /root may exist only to hold the bound Python install (pyenv); nothing else of /root is visible.
    assert not root_line or set(eval(root_line[0][5:])) <= {".pyenv"}, result
    await still_works(sb)


@case
async def parent_environment_is_invisible(sb: Sandbox) -> None:
    assert os.environ.get("AGENT_RL_FAKE_SECRET") == FAKE_SECRET, "the fixture must set the fake secret"
    code = (
        "import os\nprint(dict(os.environ))\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        try:\n            print(open(f'/proc/{p}/environ','rb').read())\n"
        "        except OSError:\n            pass\n"
    )
    result = await sb.run(code)
    assert result.exit_code == 0, result
    assert FAKE_SECRET not in result.stdout + result.stderr
    await still_works(sb)


@case
async def writes_outside_tmp_fail(sb: Sandbox) -> None:
    code = (
        "import os, sys\n"
        "for path in ['/x', '/usr/x', sys.prefix + '/x', '/etc/x', '/home/x', os.path.dirname(os.__file__) + '/x']:\n"
        "    try:\n        open(path, 'w').write('x'); print('WROTE', path)\n"
        "    except OSError as e:\n        print('denied', path)\n"
        "open('/tmp/ok', 'w').write('x'); print('tmp ok')\n"
    )
    result = await sb.run(code)
    assert "WROTE" not in result.stdout and "tmp ok" in result.stdout, result
    await still_works(sb)


@case
async def filling_tmp_is_capped_and_cleaned(sb: Sandbox) -> None:
    code = (
        "n = 0\nblock = b'x' * (1 << 20)\n"
        "try:\n"
        "    for i in range(1024):\n"
        "        with open(f'/tmp/f{i}', 'wb') as f:\n            f.write(block * 8)\n"
        "        n += 8\n"
        "except OSError as e:\n    print('stopped', type(e).__name__)\n"
        "print('MiB', n)\n"
    )
    result = await sb.run(code, limits=Limits(timeout_s=20))
    assert "stopped" in result.stdout, result
    assert int(result.stdout.split("MiB")[1]) < 1024, result
    after = await sb.run("import os; print(*os.listdir('/tmp'))")
    # Only host paths bound into /tmp may remain (the venv, when the checkout itself lives under /tmp).
    assert set(after.stdout.split()) <= HOST_TMP_ENTRIES, after
    await still_works(sb)


@case
async def fork_bomb_is_capped(sb: Sandbox) -> None:
    baseline = await process_count(sb)
    code = (
        "import os, time\nstarted = 0\n"
        "for _ in range(500):\n"
        "    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n"
        "    if pid == 0:\n        time.sleep(60); os._exit(0)\n"
        "    started += 1\n"
        "print('started', started, flush=True)\n"
    )
    result = await sb.run(code, limits=Limits(timeout_s=20, processes=64))
    assert result.exit_code == 0, result
    # The cap is per sandbox and also covers its own few processes (bwrap or init, fork-server).
    assert int(result.stdout.split()[1]) <= 64 + 8, result
    assert await process_count(sb) <= baseline
    await still_works(sb)


@case
async def allocating_4gib_fails_with_oom(sb: Sandbox) -> None:
    result = await sb.run("x = bytearray(4 << 30)\nprint('ALLOCATED')", limits=Limits(memory_bytes=1 << 30))
    assert "ALLOCATED" not in result.stdout and result.exit_code != 0, result
    assert result.oom_killed, result
    await still_works(sb)


@case
async def infinite_loop_with_setsid_grandchildren_is_killed(sb: Sandbox) -> None:
    baseline = await process_count(sb)
    code = (
        "import subprocess, sys\n"
        "for _ in range(3):\n"
        "    subprocess.Popen([sys.executable, '-c', 'while True: pass'], start_new_session=True)\n"
        "print('spawned', flush=True)\nwhile True:\n    pass\n"
    )
    result = await sb.run(code, limits=Limits(timeout_s=1.5))
    assert result.timed_out and "spawned" in result.stdout, result
    assert await process_count(sb) <= baseline
    await still_works(sb)


@case
async def one_gib_of_stdout_is_capped_and_host_memory_flat(sb: Sandbox) -> None:
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"
    result: ExecResult = await sb.run(code, limits=Limits(timeout_s=60, output_bytes=64 << 10))
    assert result.stdout_truncated and len(result.stdout) <= 64 << 10, (len(result.stdout), result.exit_code)
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    assert peak_after - peak_before < 100 * 1024
    await still_works(sb)


@case
async def killing_parent_and_other_pids_leaves_pool_working(sb: Sandbox) -> None:
    code = (
        "import os, signal\n"
        "for target in [os.getppid(), 1, -1]:\n"
        "    try:\n        os.kill(target, signal.SIGKILL)\n"
        "    except OSError as e:\n        print('denied', target)\n"
        "print('survived')\n"
    )
    await sb.run(code)
    await still_works(sb)
    await still_works(sb)


@case
async def background_process_does_not_survive_into_next_call(sb: Sandbox) -> None:
    code = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
        "print(p.pid)\n"
    )
    result = await sb.run(code)
    assert result.exit_code == 0, result
    check = await sb.run(
        "import os\nfor p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        try:\n            print(open(f'/proc/{p}/cmdline','rb').read())\n"
        "        except OSError:\n            pass\n"
    )
    # the listing ran to its end: it shows at least its own command line
    assert check.exit_code == 0 and "b'" in check.stdout, check
    assert b"time.sleep(300)".decode() not in check.stdout, check
    await still_works(sb)


@case
async def state_does_not_leak_between_calls(sb: Sandbox) -> None:
    first = await sb.run(
        "import builtins, os\nbuiltins.LEAK = 1\nos.environ['LEAK'] = '1'\n"
        "open('/tmp/leak', 'w').write('1')\nprint('set')"
    )
    assert first.stdout == "set\n", first
    second = await sb.run(
        "import builtins, os\n"
        "print(hasattr(builtins, 'LEAK'), 'LEAK' in os.environ, os.path.exists('/tmp/leak'))"
    )
    assert second.stdout == "False False False\n", second
    await still_works(sb)


# ---- syscalls the seccomp filter refuses (issue 15) ------------------------------------------
# Each probe calls the raw syscall with arguments that, without the filter, succeed or fail with an
# errno other than EPERM where the kernel allows it (unshare(CLONE_NEWUSER), ptrace(TRACEME),
# process_vm_readv, kcmp, personality, userfaultfd, io_uring_setup, perf_event_open, clock_settime,
# settimeofday, pidfd_getfd, clone3, ...); the filter answers EPERM (clone3: ENOSYS) before the
# kernel looks at them. Syscall numbers come from libseccomp for this machine's ABI.


def _syscall_numbers(names: list[str]) -> dict[str, int]:
    import pyseccomp

    numbers = {name: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in names}
    return {name: nr for name, nr in numbers.items() if nr >= 0}  # negative: not on this ABI


_PROBE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {numbers!r}
def call(name, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(NR[name]), *[ctypes.c_long(a) for a in args])
    if ret == 0 and name in ("clone", "clone3"):
        os._exit(0)  # the call made a child: it must not go on running this script
    return name, ret, errno.errorcode.get(ctypes.get_errno(), "0") if ret == -1 else "ok"
results = [{calls}]
for name, ret, err in results:
    print(name, ret, err)
"""


async def _probe(sb: Sandbox, calls: list[str]) -> list[tuple[str, str]]:
    """(syscall, errno name or 'ok') per call, in order; calls missing on this ABI are left out."""
    numbers = _syscall_numbers(sorted({c.split(",")[0].strip("'") for c in calls}))
    kept = [c for c in calls if c.split(",")[0].strip("'") in numbers]
    code = _PROBE.format(numbers=numbers, calls=", ".join(f"call({c})" for c in kept))
    result = await sb.run(code)
    assert result.exit_code == 0, result
    return [(line.split()[0], line.split()[2]) for line in result.stdout.splitlines()]


@case
async def nested_user_namespaces_are_refused(sb: Sandbox) -> None:
    # util-linux's `unshare` where the sandbox has it (the local one does; the docker image does not)
    result = await sb.run(
        "import shutil, subprocess\n"
        "for args in (['-r'], ['-U', '-p', '-n', '-m', '-f']):\n"
        "    if shutil.which('unshare'):\n"
        "        r = subprocess.run(['unshare', *args, 'true'], capture_output=True, text=True)\n"
        "        print(r.returncode, r.stderr.strip())\n"
    )
    assert result.exit_code == 0, result
    assert all(not line.startswith("0 ") for line in result.stdout.splitlines()), result
    assert all("Operation not permitted" in line for line in result.stdout.splitlines()), result
    new_user, new_pid, new_net, new_ns = 0x10000000, 0x20000000, 0x40000000, 0x00020000
    sigchld = 17
    got = await _probe(
        sb,
        [
            f"'unshare', {new_user}",
            f"'unshare', {new_net | new_ns}",
            f"'clone', {new_user | sigchld}, 0, 0, 0, 0",
            f"'clone', {new_pid | sigchld}, 0, 0, 0, 0",
            "'clone3', 0, 0",
            "'setns', 0, 0",
        ],
    )
    assert [err for _, err in got] == ["EPERM"] * 4 + ["ENOSYS", "EPERM"], got
    await still_works(sb)


@case
async def mount_syscalls_are_refused(sb: Sandbox) -> None:
    got = await _probe(
        sb,
        [
            "'mount', 0, 0, 0, 0, 0",
            "'umount2', 0, 0",
            "'pivot_root', 0, 0",
            "'chroot', 0",
            "'fsopen', 0, 0",
            "'open_tree', -1, 0, 0",
            "'move_mount', -1, 0, -1, 0, 0",
            "'open_by_handle_at', -1, 0, 0",
        ],
    )
    assert {err for _, err in got} == {"EPERM"} and len(got) >= 5, got
    await still_works(sb)


@case
async def kernel_attack_surface_syscalls_are_refused(sb: Sandbox) -> None:
    addr_no_randomize = 0x0040000
    got = await _probe(
        sb,
        [
            "'bpf', 5, 0, 0",
            "'perf_event_open', 0, 0, -1, -1, 0",
            "'userfaultfd', 1",
            "'io_uring_setup', 1, 0",
            "'keyctl', 0, -3, 0",
            "'add_key', 0, 0, 0, 0, 0",
            "'request_key', 0, 0, 0, 0",
            "'kexec_load', 0, 0, 0, 0",
            "'init_module', 0, 0, 0",
            "'finit_module', -1, 0, 0",
            "'delete_module', 0, 0",
            "'clock_settime', 0, 0",
            "'settimeofday', 0, 0",
            "'adjtimex', 0",
            "'reboot', 0, 0, 0, 0",
            "'swapon', 0, 0",
            "'acct', 0",
            "'iopl', 3",
            f"'personality', {addr_no_randomize}",
        ],
    )
    assert {err for _, err in got} == {"EPERM"} and len(got) >= 15, got
    await still_works(sb)


@case
async def other_processes_cannot_be_traced_or_read(sb: Sandbox) -> None:
    got = await _probe(
        sb,
        [
            "'ptrace', 0, 0, 0, 0",  # PTRACE_TRACEME
            "'process_vm_readv', os.getpid(), 0, 0, 0, 0, 0",
            "'kcmp', os.getpid(), os.getpid(), 0, 0, 0",
            "'pidfd_getfd', -1, 0, 0",
        ],
    )
    assert got == [(name, "EPERM") for name in ("ptrace", "process_vm_readv", "kcmp", "pidfd_getfd")], got
    await still_works(sb)


@case
async def threads_and_subprocesses_still_work_under_the_filter(sb: Sandbox) -> None:
    code = (
        "import threading, subprocess, sys, concurrent.futures as cf\n"
        "with cf.ThreadPoolExecutor(4) as ex:\n    print(sum(ex.map(lambda x: x * x, range(10))))\n"
        "print(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True).stdout.strip())\n"
        "print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])\n"
    )
    result = await sb.run(code)
    assert result.stdout == "285\n7\n2\n", result
