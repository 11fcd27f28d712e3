"""The run's key and the checks every service uses (sandboxes/auth.py, agent_rl/auth.py), as units; each service
is tested behind its own port in tests/engines, tests/gateway and tests/sandboxes, and a training run across
nodes in tests/cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from aiohttp import web

from agent_rl import auth
from agent_rl.errors import UserError
from sandboxes.auth import KEY_ENV, InsecureBind, KeyCheck, check_bind, is_loopback

KEY = "k-" + "x" * 40


@pytest.mark.parametrize(
    ("header", "passes"),
    [
        (f"Bearer {KEY}", True),
        (f"bearer {KEY}", True),  # the scheme is case-insensitive (RFC 7235), as vLLM reads it
        (None, False),
        ("", False),
        ("Bearer ", False),
        (f"Basic {KEY}", False),
        (f"Bearer {KEY}x", False),
        (f"Bearer {KEY[:-1]}", False),
        (KEY, False),  # no scheme
    ],
)
def test_a_request_passes_only_with_the_exact_key_as_a_bearer_token(header: str | None, passes: bool) -> None:
    refusal = KeyCheck(KEY).refusal("POST", "/generate", header)
    assert (refusal is None) == passes
    if not passes:  # OpenAI's body: the official clients raise AuthenticationError on it
        assert (
            refusal["error"]["code"] == "invalid_api_key"
            and refusal["error"]["type"] == "invalid_request_error"
        )
        assert "POST /generate" in refusal["error"]["message"]


def test_only_get_health_is_open() -> None:
    check = KeyCheck(KEY)
    assert check.refusal("GET", "/health", None) is None
    assert check.refusal("HEAD", "/health", None) is None
    assert check.refusal("POST", "/health", None) is not None
    assert check.refusal("GET", "/health_generate", None) is not None
    assert check.refusal("GET", "/metrics", None) is not None


def test_an_empty_key_is_refused_as_a_key() -> None:
    with pytest.raises(ValueError, match="empty API key"):
        KeyCheck("")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("0.0.0.0", False),
     ("10.1.2.3", False), ("::", False), ("node7.cluster", False)],
)  # fmt: skip
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_routable_bind_without_a_key_is_refused_unless_insecure() -> None:
    with pytest.raises(InsecureBind, match=r"--host 0\.0\.0\.0 .*AGENT_RL_API_KEY.*--insecure"):
        check_bind("0.0.0.0", None, insecure=False, service="agent-rl serve")
    check_bind("0.0.0.0", KEY, insecure=False, service="agent-rl serve")
    check_bind("0.0.0.0", None, insecure=True, service="agent-rl serve")
    check_bind("127.0.0.2", None, insecure=False, service="agent-rl serve")
    with pytest.raises(UserError, match="agent-rl gateway: --host 10.0.0.5"):  # one line on the command line
        auth.check_serve_bind("10.0.0.5", None, insecure=False, service="agent-rl gateway")


def test_a_run_makes_a_key_of_its_own_and_gives_the_environment_back(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(auth.WEIGHT_DIRS_ENV, raising=False)
    with auth.run_access(tmp_path) as first:
        assert os.environ[KEY_ENV] == first and len(first) >= 40
        shm = Path(os.environ[auth.SHM_ENV])
        assert shm.is_dir() and shm.stat().st_mode & 0o777 == 0o700
        roots = os.environ[auth.WEIGHT_DIRS_ENV].split(os.pathsep)
        assert roots == [str(shm), str(tmp_path.resolve())]
        from agent_rl.weights.tensors import shm_dir

        assert shm_dir().parent == shm  # in-memory pushes go through the run's own directory
    with auth.run_access(tmp_path) as second:
        assert second != first  # a fresh key per run
    assert (
        KEY_ENV not in os.environ
        and auth.WEIGHT_DIRS_ENV not in os.environ
        and auth.SHM_ENV not in os.environ
    )
    assert not shm.exists()


def test_a_run_keeps_the_key_the_user_set(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(auth.EXTERNAL_KEY_ENV, "ext-" + "e" * 40)
    with auth.run_access(tmp_path, external_agents=True) as key:
        assert key == KEY
    assert os.environ[KEY_ENV] == KEY


def test_external_agents_need_a_key_of_their_own_not_the_runs(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(auth.EXTERNAL_KEY_ENV, raising=False)
    with (
        pytest.raises(
            UserError, match=r"type: external.*set \$AGENT_RL_EXTERNAL_AGENT_KEY.*never \$AGENT_RL_API_KEY"
        ),
        auth.run_access(tmp_path, external_agents=True),
    ):
        pass
    monkeypatch.setenv(auth.EXTERNAL_KEY_ENV, "ext-" + "e" * 40)
    with auth.run_access(tmp_path, external_agents=True) as key:  # the run's own key may be made up now
        assert key != os.environ[auth.EXTERNAL_KEY_ENV]
    monkeypatch.setenv(KEY_ENV, "ext-" + "e" * 40)  # the same value for both: refused
    with pytest.raises(UserError, match="must differ"), auth.run_access(tmp_path, external_agents=True):
        pass


async def test_the_asgi_check_refuses_a_websocket_without_the_key_and_lets_lifespan_pass() -> None:
    """The MCP server's guard (ASGI): a websocket handshake is a request like any other; the server's own
    lifespan events carry no client and pass."""
    from sandboxes.auth import asgi_key_check

    reached: list[str] = []

    async def app(scope, receive, send):  # the guarded app: records what reached it
        reached.append(scope["type"])

    guarded = asgi_key_check(app, KEY)
    sent: list[dict] = []

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "websocket.connect"}

    for headers in ([], [(b"authorization", b"Bearer wrong")]):
        await guarded({"type": "websocket", "path": "/mcp", "headers": headers}, receive, send)
    assert reached == [] and [m["type"] for m in sent] == ["websocket.close"] * 2
    await guarded({"type": "websocket", "path": "/mcp", "headers": [(b"authorization", f"Bearer {KEY}".encode())]},
                  receive, send)  # fmt: skip
    await guarded({"type": "lifespan"}, receive, send)
    assert reached == ["websocket", "lifespan"]


def test_a_weight_path_is_answered_resolved(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "latest").symlink_to(tmp_path / "v1")
    allowed = auth.weight_dirs(str(tmp_path))
    assert auth.check_weight_path(str(tmp_path / "latest"), allowed, "model_path") == str(
        (tmp_path / "v1").resolve()
    )


def test_weights_load_only_from_under_the_allowed_dirs_even_through_a_symlink(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    (run / "w" / "v1").mkdir(parents=True)
    outside.mkdir()
    (run / "w" / "escape").symlink_to(outside)
    allowed = auth.weight_dirs(str(run))
    auth.check_weight_path(str(run / "w" / "v1"), allowed, "model_path")
    auth.check_weight_path(str(run), allowed, "model_path")
    auth.check_weight_path(str(outside), None, "model_path")  # no allow-list: anywhere
    for bad in (outside, run / "w" / "escape", run / ".." / "outside", Path(str(run) + "-sibling")):
        with pytest.raises(web.HTTPForbidden) as e:
            auth.check_weight_path(str(bad), allowed, "model_path")
        assert str(bad) in e.value.text and '"code": "path_not_allowed"' in e.value.text
        assert str(run) not in e.value.text.replace(str(bad), "")  # the allowed roots are not named
