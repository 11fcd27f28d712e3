"""The docker sandbox image's root filesystem (sandboxes/image.py) holds the packages it declares and no others."""

from __future__ import annotations

import io
import tarfile


def test_the_rootfs_holds_only_the_declared_site_packages_and_no_static_libpython() -> None:
    from sandboxes.image import base_stdlib, rootfs_tar

    with tarfile.open(fileobj=io.BytesIO(rootfs_tar(("numpy",)))) as tar:
        names = tar.getnames()
    stdlib = base_stdlib()
    site = str(stdlib / "site-packages").lstrip("/") + "/"
    top = {n[len(site) :].split("/")[0] for n in names if n.startswith(site)}
    # the base install's own packages (pip at least, wherever Python was installed with it) stay out
    assert top == {
        "numpy",
        "numpy.libs",
        *(t for t in top if t.startswith("numpy-") and t.endswith(".dist-info")),
    }
    assert not [n for n in names if n.startswith(str(stdlib).lstrip("/") + "/config-")]
    assert any(n.endswith("/json/__init__.py") for n in names)  # the standard library is there


def test_the_harbor_base_declares_every_package_the_installed_pytest_needs() -> None:
    """The base image holds only what it declares (above): a pytest that needs one more package (pytest 9 added
    pygments) would fail every task's verifier, so the declared list follows the installed pytest's metadata."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    from envs.harbor.image import BASE_PACKAGES

    imports = md.packages_distributions()  # import name -> distributions
    by_dist: dict[str, set[str]] = {}
    for name, dists in imports.items():
        for d in dists:
            by_dist.setdefault(d.lower(), set()).add(name)
    needed, todo = set(), ["pytest"]
    while todo:
        dist = todo.pop()
        if dist.lower() in needed:
            continue
        needed.add(dist.lower())
        for r in map(Requirement, md.requires(dist) or []):
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    missing = {
        d: by_dist[d] - set(BASE_PACKAGES) for d in needed if by_dist.get(d, set()) - set(BASE_PACKAGES)
    }
    assert not missing, f"envs/harbor/image.py BASE_PACKAGES lacks {missing}"
