"""The seccomp filter every fork-server installs on itself (and so on every call it forks).

Denied, with EPERM: what Docker's default profile denies an unprivileged container and a
sandboxed interpreter never needs — new namespaces (unshare, setns, clone with CLONE_NEW*
flags), mounts, keyrings, bpf, perf_event_open, ptrace and cross-process memory access,
kexec and kernel modules, clock and time setting, userfaultfd, io_uring, reboot, swap,
quotas, raw I/O ports, personality flags that turn off ASLR. clone3 gets ENOSYS (its flags
sit behind a pointer a filter cannot read; glibc then falls back to clone, as under Docker).
Syscalls of another ABI (i386 `int 0x80`, x32) kill the process: a deny list for one ABI
would be bypassed through another.

The BPF program is built on the host with libseccomp (through `pyseccomp`, its ctypes
bindings) and handed to the fork-server as bytes; the fork-server stays stdlib-only and
loads it with prctl(PR_SET_SECCOMP). The same program serves the local and docker backends.
"""

from __future__ import annotations

import contextlib
import errno
import tempfile
from functools import cache

from sandboxes.api import SandboxError

_INSTALL_HINT = (
    "install libseccomp (Debian/Ubuntu: `apt-get install libseccomp2`) and its Python bindings "
    "(`pip install pyseccomp`), or pass seccomp=False to run without the filter (weaker isolation)"
)

DENIED = (
    # namespaces and mounts
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "name_to_handle_at",
    "open_by_handle_at",
    # kernel attack surface an interpreter never needs
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "lookup_dcookie",
    "fanotify_init",
    "syslog",
    "sysfs",
    "_sysctl",
    "uselib",
    "ustat",
    "vm86",
    "vm86old",
    "nfsservctl",
    "quotactl",
    "quotactl_fd",
    # other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    # the machine
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "iopl",
    "ioperm",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "settimeofday",
    "stime",
)

# clone(2)'s namespace flags (linux/sched.h).
CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}
# personality(2) flags that weaken the process (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC).
_PERSONALITY_DENIED = (0x0040000, 0x0400000)


@cache
def filter_bpf() -> bytes:
    """The filter as a raw BPF program (struct sock_filter[]) for this machine's native ABI."""
    try:
        import pyseccomp as sc
    except (ImportError, RuntimeError, OSError) as e:
        raise SandboxError(f"sandbox seccomp filter: cannot load libseccomp ({e}); {_INSTALL_HINT}") from e
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    with contextlib.suppress(OSError):  # libseccomp >= 2.5: a binary tree instead of a linear scan
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        number = sc.resolve_syscall(sc.Arch.NATIVE, name)
        if number == -1:  # __NR_SCMP_ERROR: libseccomp does not know it (an older libseccomp)
            continue
        f.add_rule(eperm, number)
    for flag in CLONE_NEW_FLAGS.values():
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for flag in _PERSONALITY_DENIED:
        f.add_rule(eperm, "personality", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    if sc.resolve_syscall(sc.Arch.NATIVE, "clone3") != -1:
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        program = out.read()
    if not program or len(program) % 8:
        raise SandboxError(
            f"sandbox seccomp filter: libseccomp exported {len(program)} bytes, not a BPF program"
        )
    return program
