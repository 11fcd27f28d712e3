"""A Docker daemon that restarts under a live pool of task containers leaves none of them behind.

Its own dockerd (envs/harbor/private_dockerd.py), so that the session's engine (conftest.py) is not disturbed;
the image comes from the session's engine by `docker save | docker load` (a rebuild takes minutes under load).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker_test_image import TEST_IMAGE

from envs.harbor.private_dockerd import PrivateDockerd
from sandboxes.api import SandboxError
from sandboxes.docker_engine import our_containers
from sandboxes.image import image_python
from sandboxes.task_containers import ContainerPool, ContainerSpec

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def own_engine(docker_host: str) -> Iterator[PrivateDockerd]:
    root = Path(tempfile.mkdtemp(prefix="agent-rl-dockerd-restart-"))
    engine = PrivateDockerd(root)
    engine.start()
    try:
        image = docker.DockerClient(base_url=docker_host).images.get(TEST_IMAGE)
        docker.DockerClient(base_url=engine.host).images.load(b"".join(image.save(named=True)))
        yield engine
    finally:
        engine.stop()
        subprocess.Popen(["rm", "-rf", str(root)], start_new_session=True)


def test_a_daemon_restart_under_a_live_pool_leaves_none_of_its_containers(own_engine: PrivateDockerd):
    run = f"test-restart-{os.getpid()}"
    pool = ContainerPool(own_engine.host, run=run, pool="harbor", warm=2)
    try:
        spec = ContainerSpec(image=TEST_IMAGE, python=image_python(sys.executable))
        held = [pool.start(spec) for _ in range(2)]  # two episodes running, the warm ones refilling
        assert len(our_containers(pool.client, **{"agent-rl.run": run})) >= 2

        own_engine.stop()  # SIGTERM: the engine stops its containers
        own_engine.start()

        client = docker.DockerClient(base_url=own_engine.host)
        assert our_containers(client, **{"agent-rl.run": run}) == []  # the engine removed them (auto_remove)
        ContainerPool(own_engine.host, run=f"{run}-new", pool="harbor", warm=0).close()
        assert our_containers(client) == []
        # The live pool's episodes see their container gone as an error (an infra failure), not an empty output.
        with pytest.raises(SandboxError, match="exec failed"):
            held[0].exec("true", timeout_s=30)
    finally:
        pool.close()
