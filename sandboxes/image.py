"""Build the docker sandbox image offline from the host's Python (no registry needed).

The image holds: the base Python install at its host path (stdlib, without its test suite, its own site-packages
or the static libpython), the chosen site-packages (numpy, sympy and mpmath by default) copied into the base
install's site-packages, every shared library `ldd` names for those binaries, an empty /tmp, and the fork-server at
/opt/agent-rl/forkserver.py. It is streamed as a tar into `docker import` (what
`tar -C rootfs -c . | docker import - NAME` does), ~3 s. Equivalent shell:

    agent-rl sandbox build-image --tag agent-rl-sandbox:py3.11
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from sandboxes.api import SandboxError
from sandboxes.docker_engine import docker_client
from sandboxes.worker import FORKSERVER_PATH, INSIDE_FORKSERVER

_SKIP_DIRS = {"test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip"}


def image_python(python: str = sys.executable) -> str:
    """Path of the interpreter inside the image (the host's base install, same path)."""
    base = subprocess.run(
        [
            python,
            "-I",
            "-c",
            "import sys, sysconfig; print(sys.base_prefix, sysconfig.get_config_var('VERSION'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return f"{base[0]}/bin/python{base[1]}"


def _shared_libs(binaries: Iterable[Path]) -> set[Path]:
    libs: set[Path] = set()
    for binary in binaries:
        out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout
        for match in re.finditer(r"(/\S+) \(0x", out):
            libs.add(Path(match.group(1)))
    return libs


class _Tar:
    """A tar being written that adds each path once (docker import rejects duplicates)."""

    def __init__(self, tar: tarfile.TarFile):
        self.tar = tar
        self.seen: set[str] = set()

    def add(self, src: Path | str, arcname: str, *, leave_out: Iterable[Path] = ()) -> None:
        """Add `src` (recursively) as `arcname`; `leave_out`: folders under it left out, with all they hold."""
        left = {str(p).lstrip("/") for p in leave_out}

        def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            return None if info.name in left else self._keep(info)

        self.tar.add(str(src), arcname=arcname.lstrip("/"), filter=keep)

    def _keep(self, info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        skip = set(Path(info.name).parts) & _SKIP_DIRS and "site-packages" not in info.name
        if info.name in self.seen or skip or (info.name.endswith(".pyc") and ".opt-" in info.name):
            return None
        self.seen.add(info.name)
        return info


def _add_dir_entry(tar: tarfile.TarFile, path: str, mode: int) -> None:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def base_stdlib() -> Path:
    """The base install's standard library folder (the image keeps it at this path; its site-packages is inside)."""
    return Path(
        sysconfig.get_paths(vars={"installed_base": sys.base_prefix, "base": sys.base_prefix})["stdlib"]
    )


def rootfs_tar(packages: Sequence[str] = ("numpy", "sympy", "mpmath"), tools: Sequence[str] = ()) -> bytes:
    """The image's root filesystem as an uncompressed tar (built from *this* interpreter).

    `tools`: host programs (looked up on PATH) copied to /usr/bin with their libraries, with /bin a link to
    usr/bin and /usr/bin/python3 a link to the interpreter: the shell and coreutils a task container needs.
    """
    base = Path(sys.base_prefix)
    version = sysconfig.get_config_var("VERSION")
    stdlib = base_stdlib()
    site = stdlib / "site-packages"
    binaries = [Path(os.path.realpath(base / "bin" / f"python{version}"))]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as raw:
        tar = _Tar(raw)
        for d, mode in (("/tmp", 0o1777), ("/dev", 0o755), ("/proc", 0o555), ("/opt/agent-rl", 0o755)):
            _add_dir_entry(raw, d, mode)
        tar.add(binaries[0], str(base / "bin" / f"python{version}"))
        # the base install's own site-packages stay out (only `packages` go in): on a machine whose system Python
        # holds scipy, awscli, ... the image was 0.8 GB of them, and the sandbox could import what it never declared;
        # so does config-3.11-*, the static libpython for linking extensions (46 MB; the image has no compiler)
        tar.add(stdlib, str(stdlib), leave_out=[site, *stdlib.glob("config-*")])
        libdir = base / "lib"
        for lib in libdir.glob("libpython*.so*"):
            tar.add(lib, str(lib))
            binaries.append(lib)
        binaries += list((stdlib / "lib-dynload").glob("*.so"))
        for name in packages:
            spec = importlib.util.find_spec(name)
            if spec is not None and not spec.submodule_search_locations and spec.origin:  # a module, one file
                tar.add(spec.origin, str(site / Path(spec.origin).name))
                continue
            if spec is None or not spec.submodule_search_locations:
                raise SandboxError(f"build-image: package {name!r} is not importable by {sys.executable}")
            pkg_dir = Path(next(iter(spec.submodule_search_locations)))
            for extra in [
                pkg_dir,
                *pkg_dir.parent.glob(f"{name}.libs"),
                *pkg_dir.parent.glob(f"{name}-*.dist-info"),
            ]:
                tar.add(extra, str(site / extra.name))
                binaries += list(extra.rglob("*.so*"))
        for lib in sorted(_shared_libs(binaries)):
            if not str(lib).startswith(str(base)) and "site-packages" not in str(lib):
                tar.add(os.path.realpath(lib), str(lib))
        loader = Path("/lib64/ld-linux-x86-64.so.2")
        if loader.exists():
            tar.add(os.path.realpath(loader), str(loader))
        tar.add(FORKSERVER_PATH, INSIDE_FORKSERVER)
        if tools:
            _add_tools(raw, tar, tools, str(base / "bin" / f"python{version}"))
    return buf.getvalue()


def _add_tools(raw: tarfile.TarFile, tar: _Tar, tools: Sequence[str], python: str) -> None:
    binaries = []
    for name in tools:
        found = shutil.which(name)
        if found is None:
            raise SandboxError(f"build-image: program {name!r} is not on this machine's PATH")
        real = Path(os.path.realpath(found))
        tar.add(real, f"/usr/bin/{name}")
        binaries.append(real)
    for lib in sorted(_shared_libs(binaries)):
        tar.add(os.path.realpath(lib), str(lib))
    for link, target in (("bin", "usr/bin"), ("usr/bin/python3", python), ("usr/bin/python", python)):
        if link not in tar.seen:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, target
            raw.addfile(info)
            tar.seen.add(link)


DEFAULT_PACKAGES = ("numpy", "sympy", "mpmath")


def build_image(
    tag: str,
    *,
    python: str = sys.executable,
    docker_host: str | None = None,
    packages: Sequence[str] = DEFAULT_PACKAGES,
    tools: Sequence[str] = (),
) -> str:
    """Build and import the image; returns its tag. `python` must be this interpreter for now."""
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        raise SandboxError(
            f"build-image: run it with the interpreter to copy ({python}), not {sys.executable}"
        )
    client = docker_client(docker_host)
    data = rootfs_tar(packages, tools)
    repo, _, version = tag.partition(":")
    client.api.import_image_from_data(data, repository=repo, tag=version or "latest")
    client.images.get(tag)
    return tag
