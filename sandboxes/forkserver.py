"""The process that lives inside a sandbox and forks one child per request.

Why a fork-server: starting a sandbox and a Python interpreter costs ~25 ms; forking an
already-initialised interpreter costs ~1 ms. The host sends length-prefixed JSON
requests on fd 0 and reads replies on fd 1 (see `sandboxes.worker`). After every call
every process other than this one (and live session processes) is killed and /tmp is
emptied, so nothing survives into the next call.

Stdlib only, and self-contained: the host passes this file's source to `python -c`.
"""

import argparse
import base64
import contextlib
import ctypes
import gc
import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time
import traceback

_HEADER = struct.Struct(">I")
_CHUNK = 65536
_WORKDIR = "/tmp"  # set by --workdir; emptied after every call


def _read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _recv(fd):
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    return json.loads(_read_exact(fd, size))


def _send(fd, msg):
    data = json.dumps(msg).encode()
    data = _HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded once, before any fork: children only call into it


def _prctl(option, value):
    _LIBC.prctl(option, value, 0, 0, 0)


PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = (
    1,
    4,
    22,
    36,
    38,
)
SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(program):
    """Load a raw BPF program (built on the host by sandboxes.seccomp) on this process; inherited on fork."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)  # its own handle: argtypes set here must not apply to _prctl
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


class Capture:
    """Reads one output pipe, keeping at most `cap` bytes and discarding the rest."""

    def __init__(self, fd, cap):
        self.fd, self.cap, self.buf, self.truncated, self.open = fd, cap, bytearray(), False, True

    def pump(self):
        """Read one chunk; False when nothing (more) is available right now."""
        try:
            chunk = os.read(self.fd, _CHUNK)
        except BlockingIOError:
            return False
        if not chunk:
            self.open = False
            return False
        room = self.cap - len(self.buf)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[: max(room, 0)]
        self.buf += chunk
        return True

    def drain(self):
        """Read what is left without blocking (all writers are dead, or the session is idle)."""
        os.set_blocking(self.fd, False)
        while self.open and self.pump():
            pass

    def text(self):
        return self.buf.decode("utf-8", "replace")


class Server:
    def __init__(self, pidns, private_shm, nproc_rlimit, keep=()):
        self.keep = frozenset(keep)  # entries of the workdir that are host bind mounts (a venv under /tmp)
        self.pidns = pidns
        self.private_shm = private_shm
        self.nproc_rlimit = nproc_rlimit
        self.sessions = {}  # sid -> Session
        self.next_sid = 1
        self.me = os.getpid()

    # ---- cleanup -------------------------------------------------------------------
    def _descendants(self):
        """Pids of every process below this one (orphans come back to us: we are a subreaper)."""
        parent = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if fields[0] != b"Z":
                parent[int(name)] = int(fields[1])
        found, frontier = set(), {self.me}
        while frontier:
            frontier = {p for p, pp in parent.items() if pp in frontier and p not in found}
            found |= frontier
        return found

    def _reap(self, block):
        while True:
            try:
                pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def kill_leftovers(self):
        keep = {s.pid for s in self.sessions.values()}
        if self.pidns and not keep:
            # pid 1 of our own pid namespace: kill(-1) reaches everything but us, atomically.
            with contextlib.suppress(ProcessLookupError):  # nothing left
                os.kill(-1, signal.SIGKILL)
            self._reap(block=True)
            return
        if not keep:
            try:
                os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return  # no children means no descendants: orphans would have come back to us
        for _ in range(1000):
            victims = self._descendants() - keep
            if not victims:
                break
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.0005)
            self._reap(block=False)
        self._reap(block=False)

    def clean_dirs(self):
        """Empty /tmp (and /dev/shm) so no call sees the files of the previous one."""
        ok = True
        # /dev/shm is private only inside a sandbox; never touch the host's.
        for root in (_WORKDIR, "/dev/shm") if self.private_shm else (_WORKDIR,):
            try:
                names = os.listdir(root)
            except OSError:
                continue
            for name in names:
                if root == _WORKDIR and name in self.keep:
                    continue
                path = os.path.join(root, name)
                try:
                    if os.path.isdir(path) and not os.path.islink(path):
                        for dirpath, dirnames, _ in os.walk(path):
                            for d in dirnames:
                                os.chmod(os.path.join(dirpath, d), 0o700)
                        os.chmod(path, 0o700)
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
                except OSError:
                    ok = False
        return ok

    # ---- one stateless call --------------------------------------------------------
    def run(self, req):
        limits = req["limits"]
        for rel, b64 in (req.get("files") or {}).items():
            path = os.path.join(_WORKDIR, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(base64.b64decode(b64))
        if req.get("stdin"):
            stdin_fd = os.memfd_create("stdin")
            os.write(stdin_fd, req["stdin"].encode())
            os.lseek(stdin_fd, 0, os.SEEK_SET)
        else:
            stdin_fd = os.open("/dev/null", os.O_RDONLY)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        status_r, status_w = os.pipe()
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(req["code"], limits, self.nproc_rlimit, stdin_fd, out_w, err_w, status_w)
        for fd in (stdin_fd, out_w, err_w, status_w):
            os.close(fd)
        result = self._supervise(pid, limits, out_r, err_r, status_r, start)
        clean = self.clean_dirs()
        result["recycle"] = result["recycle"] or not clean
        return result

    def _supervise(self, pid, limits, out_r, err_r, status_r, start):
        out = Capture(out_r, limits["output_bytes"])
        err = Capture(err_r, limits["output_bytes"])
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        for fd in (out_r, err_r, pidfd):
            poller.register(fd, select.POLLIN)
        deadline = start + limits["timeout_s"]
        timed_out = False
        exited = False
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            for fd, _ in poller.poll(remaining * 1000):
                if fd == pidfd:
                    exited = True
                else:
                    cap = out if fd == out_r else err
                    cap.pump()
                    if not cap.open:
                        poller.unregister(fd)
        _, status = os.waitpid(pid, 0)
        duration = time.monotonic() - start
        self.kill_leftovers()
        out.drain()
        err.drain()
        oom = os.read(status_r, 16) == b"M"
        for fd in (out_r, err_r, status_r, pidfd):
            os.close(fd)
        if os.WIFSIGNALED(status):
            code = -os.WTERMSIG(status)
            timed_out = timed_out or os.WTERMSIG(status) == signal.SIGXCPU
            # A SIGKILL we did not send comes from the kernel's OOM killer (cgroup memory cap).
            oom = oom or (code == -signal.SIGKILL and not timed_out)
        else:
            code = os.WEXITSTATUS(status)
        if timed_out and code != -signal.SIGXCPU:
            code = -signal.SIGKILL
        return {
            "stdout": out.text(),
            "stderr": err.text(),
            "stdout_truncated": out.truncated,
            "stderr_truncated": err.truncated,
            "exit_code": code,
            "timed_out": timed_out,
            "oom_killed": oom,
            "duration_s": duration,
            "recycle": timed_out or oom,
        }

    # ---- sessions ------------------------------------------------------------------
    def session_open(self, req):
        sid = self.next_sid
        self.next_sid += 1
        self.sessions[sid] = Session(req["limits"], self.nproc_rlimit)
        return {"session": sid}

    def session_run(self, req):
        sess = self.sessions.get(req["session"])
        if sess is None:
            return {"lost": True}
        result = sess.run(req["code"], req["limits"])
        if not sess.alive:
            del self.sessions[req["session"]]
        self.kill_leftovers()
        result["lost"] = False
        return result

    def session_close(self, req):
        sess = self.sessions.pop(req["session"], None)
        if sess is not None:
            sess.kill()
        self.kill_leftovers()
        return {}

    def serve(self, inp, outp):
        handlers = {
            "run": self.run,
            "session_open": self.session_open,
            "session_run": self.session_run,
            "session_close": self.session_close,
            "ping": lambda req: {"pid": self.me, "sessions": len(self.sessions)},
        }
        while True:
            try:
                req = _recv(inp)
            except EOFError:
                return
            try:
                reply = handlers[req["op"]](req)
            except Exception:
                reply = {"error": traceback.format_exc()}
            _send(outp, reply)


class Session:
    """A long-lived child that executes code cells in one namespace, like a notebook kernel."""

    def __init__(self, limits, nproc_rlimit):
        self.cmd_r, self.cmd_w = os.pipe()
        self.done_r, self.done_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        for fd in (self.out_r, self.err_r):
            os.set_blocking(fd, False)
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.cmd_w)
            os.close(self.done_r)
            _session_child(limits, nproc_rlimit, self.cmd_r, self.done_w, out_w, err_w)
        for fd in (self.cmd_r, self.done_w, out_w, err_w):
            os.close(fd)
        self.alive = True

    def run(self, code, limits):
        start = time.monotonic()
        out = Capture(self.out_r, limits["output_bytes"])
        err = Capture(self.err_r, limits["output_bytes"])
        _send(self.cmd_w, {"code": code})
        poller = select.poll()
        for fd in (self.out_r, self.err_r, self.done_r):
            poller.register(fd, select.POLLIN)
        deadline = start + limits["timeout_s"]
        done = None
        timed_out = False
        while done is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for fd, _ in poller.poll(remaining * 1000):
                if fd == self.done_r:
                    try:
                        done = _recv(self.done_r)
                    except EOFError:
                        done = {"exit_code": None, "oom": False}
                    break
                (out if fd == self.out_r else err).pump()
        duration = time.monotonic() - start
        out.drain()
        err.drain()
        if done is None or done["exit_code"] is None:
            status = self.kill()
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            oom = False
        else:
            code, oom = done["exit_code"], done["oom"]
        return {
            "stdout": out.text(),
            "stderr": err.text(),
            "stdout_truncated": out.truncated,
            "stderr_truncated": err.truncated,
            "exit_code": -signal.SIGKILL if timed_out else code,
            "timed_out": timed_out,
            "oom_killed": oom,
            "duration_s": duration,
            "recycle": False,
            "alive": self.alive,
        }

    def kill(self):
        """Kill the session process; returns its wait status."""
        status = 0
        if self.alive:
            self.alive = False
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                status = os.waitpid(self.pid, 0)[1]
            for fd in (self.cmd_w, self.done_r, self.out_r, self.err_r):
                os.close(fd)
        return status


def _set_limits(limits, nproc_rlimit, cpu=True):
    def cap(which, value):
        resource.setrlimit(which, (value, value))

    if cpu:
        cpu_s = max(1, int(limits["cpu_s"] + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    cap(resource.RLIMIT_AS, limits["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, limits["file_bytes"])
    cap(resource.RLIMIT_CORE, 0)
    if nproc_rlimit:
        cap(resource.RLIMIT_NPROC, limits["processes"])


def _close_fds_except(*keep):
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _prepare_child(stdin_fd, out_w, err_w):
    os.setsid()
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    _prctl(PR_SET_DUMPABLE, 1)
    os.chdir(_WORKDIR)
    # File objects made once in the server (never written there, so their buffers are empty): the child
    # only points fds 0-2 at its pipes. Making them per call cost ~10% of a call's CPU (allocations that
    # copy-on-write the server's heap pages).
    sys.stdin, sys.stdout, sys.stderr = _STDIO or _make_stdio()
    sys.argv = ["-c"]
    if "" not in sys.path:
        sys.path.insert(0, "")


_STDIO = None


def _make_stdio():
    return (
        open(0, encoding="utf-8", errors="replace", closefd=False),  # noqa: SIM115
        open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False),  # noqa: SIM115
        open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1),  # noqa: SIM115
    )


def _child(code, limits, nproc_rlimit, stdin_fd, out_w, err_w, status_w):
    """Runs in the forked child: becomes the user's program, never returns."""
    exit_code = 1
    try:
        _prepare_child(stdin_fd, out_w, err_w)
        _close_fds_except(status_w)
        _set_limits(limits, nproc_rlimit)
        main = {"__name__": "__main__", "__builtins__": __builtins__}
        sys.modules["__main__"] = type(sys)("__main__")
        sys.modules["__main__"].__dict__.update(main)
        exit_code = _exec_cell(code, sys.modules["__main__"].__dict__, status_w)
    except BaseException:
        pass
    os._exit(exit_code)


def _exec_cell(code, namespace, status_w):
    """Execute one cell like `python -c`: traceback on error, SystemExit honoured."""
    exit_code = 0
    try:
        exec(compile(code, "<string>", "exec"), namespace)
    except SystemExit as e:
        if e.code is None:
            exit_code = 0
        elif isinstance(e.code, int):
            exit_code = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            exit_code = 1
    except MemoryError as e:
        os.write(status_w, b"M")
        _print_user_traceback(e)
        exit_code = 1
    except BaseException as e:
        _print_user_traceback(e)
        exit_code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return exit_code


def _print_user_traceback(e):
    """Print the traceback as `python -c` would, without this file's frame on top."""
    traceback.print_exception(type(e), e, e.__traceback__.tb_next)


def _session_child(limits, nproc_rlimit, cmd_r, done_w, out_w, err_w):
    null = os.open("/dev/null", os.O_RDONLY)
    _prepare_child(null, out_w, err_w)
    _close_fds_except(cmd_r, done_w)
    _set_limits(limits, nproc_rlimit, cpu=False)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    while True:
        try:
            cmd = _recv(cmd_r)
        except EOFError:
            os._exit(0)
        status_r, status_w = os.pipe()
        code = _exec_cell(cmd["code"], namespace, status_w)
        os.close(status_w)
        oom = os.read(status_r, 1) == b"M"
        os.close(status_r)
        _send(done_w, {"exit_code": code, "oom": oom})


def main(argv):
    global _WORKDIR
    parser = argparse.ArgumentParser(prog="forkserver")
    parser.add_argument("--workdir", default=_WORKDIR)
    parser.add_argument("--drop-uid", type=int)
    parser.add_argument("--pidns", action="store_true", help="we are pid 1 of a private pid namespace")
    parser.add_argument("--private-shm", action="store_true", help="/dev/shm is ours alone: empty it too")
    parser.add_argument("--nproc-rlimit", action="store_true", help="no cgroup: cap processes by rlimit")
    parser.add_argument("--preload", default="")
    parser.add_argument("--keep", default="", help="workdir entries never emptied (bind-mounted host paths)")
    parser.add_argument("--seccomp-bpf", default="", help="base64 BPF program to load before serving")
    args = parser.parse_args(argv)
    _WORKDIR = args.workdir
    inp, outp = os.dup(0), os.dup(1)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    os.close(null)
    if args.drop_uid is not None:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        os.setgroups([])
        os.setgid(args.drop_uid)
        os.setuid(args.drop_uid)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # bwrap's --die-with-parent; setuid cleared it
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_DUMPABLE, 0)  # sandboxed children must not ptrace or read /proc of the server
    os.chdir(_WORKDIR)
    for mod in filter(None, args.preload.split(",")):
        __import__(mod)
    # Everything imported so far is never collected: children's collections skip it, so they do not
    # touch (and copy-on-write) the parent's heap pages.
    global _STDIO
    _STDIO = _make_stdio()
    gc.collect()
    gc.freeze()
    if args.seccomp_bpf:
        try:
            _install_seccomp(base64.b64decode(args.seccomp_bpf))
        except OSError as e:
            _send(outp, {"ready": False, "error": f"cannot load the seccomp filter: {e}"})
            return
    _send(outp, {"ready": True, "pid": os.getpid(), "uid": os.getuid(), "seccomp": bool(args.seccomp_bpf)})
    keep = filter(None, args.keep.split(","))
    Server(args.pidns, args.private_shm, args.nproc_rlimit, keep).serve(inp, outp)


if __name__ == "__main__":
    main(sys.argv[1:])
