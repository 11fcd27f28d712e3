#!/usr/bin/env bash
# Install the system packages the sandbox backends need: bubblewrap and libseccomp2 (local
# backend; its seccomp filter is built with libseccomp through the pip package pyseccomp) and
# docker.io (docker backend and its tests). Idempotent; quiet; says what it did.
# Run as root (CI, containers). As another user it only reports what is missing.
set -u

want=()
command -v bwrap >/dev/null 2>&1 || want+=(bubblewrap)
command -v dockerd >/dev/null 2>&1 || want+=(docker.io)
ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || want+=(libseccomp2)
command -v chromium >/dev/null 2>&1 || want+=(chromium)  # tests/viewer: `agent-rl view` in headless Chromium

if [ ${#want[@]} -eq 0 ]; then
    echo "install_system_deps: bubblewrap, libseccomp2, docker.io and chromium already present"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install_system_deps: missing ${want[*]}; not root, so not installing (run: sudo apt-get install -y ${want[*]})"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system_deps: missing ${want[*]} and no apt-get here; install them with your package manager"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get update -qq >/dev/null 2>&1; then
    echo "install_system_deps: apt-get update failed; not installing ${want[*]}"
    exit 0
fi
if apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null 2>&1; then
    echo "install_system_deps: installed ${want[*]}"
else
    echo "install_system_deps: apt-get install ${want[*]} failed (the tests that need them will skip and say why)"
fi
exit 0
