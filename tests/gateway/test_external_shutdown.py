"""The run's end as an external agent sees it: the gateway closes every connection it accepted, and a claim
waiting for a task is answered at once.

The external agent of test_external.py twice waited on a connection the run's gateway had accepted and never
answered (its `POST /sessions/{id}/close`, sent the moment the engines' shutdown failed its last chat call, as
the gateway closed). Cause: CPython's asyncio.Server (gh-109564, open on 3.11-3.13): a connection accepted in
the loop step before `Server.close()` is handed to a task that, a step later, fails an assertion in
`Server._attach` and swallows it; the accepted socket stays open, unanswered, until the cyclic garbage
collector frees it. aiohttp's TCPSite listens through `loop.create_server`, so the gateway hit it whenever the
agent's request landed in that step. The gateway now accepts its connections itself (gateway/listener.py).
"""

from __future__ import annotations

import asyncio
import gc
import socket
from pathlib import Path

import aiohttp
import pytest

from agent_rl.gateway.server import Gateway

CONTROL = "control-key-" + "c" * 32
EXTERNAL = "external-key-" + "x" * 32
HANG_S = 30.0  # a guard, not a measurement: the answer (or EOF) comes within a few loop steps, or never


class EngineNotCalled:
    """The gateway's engine here: nothing in this file samples (claims and closes never reach an engine)."""

    resumes_constraints = False


@pytest.fixture(scope="module")
def tokenizer(tool_model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tool_model)


def _gateway(tokenizer) -> Gateway:
    return Gateway(
        EngineNotCalled(),  # type: ignore[arg-type]
        tokenizer,
        max_seq_len=64,
        api_key=CONTROL,
        external_key=EXTERNAL,
    )


def test_a_connection_accepted_as_the_gateway_closes_is_closed_with_it(tokenizer) -> None:
    """As a run ends: the gateway on the run's loop thread (agent_rl.loop_thread), a client's request sent, the
    loop let take 0..7 steps, the gateway closed in the next, then the loop closed as the run closes it (what is
    left on it cancelled). Whichever step the close lands in (before the accept, between the accept and the
    connection's protocol, after), the client is answered, closed, reset or refused; never left waiting.
    Mutant: the gateway listening through aiohttp's TCPSite again (the old `start`) leaves the connection whose
    accept the close interrupts open with its request unread, and this test fails with the step count. The
    cyclic collector is off: it would close a leaked socket by chance."""
    from agent_rl.loop_thread import LoopThread

    request = (
        b"POST /sessions/s/close HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer "
        + CONTROL.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
    )

    async def connect_then_close(gw: Gateway, steps: int) -> socket.socket:
        port = int((await gw.start()).rsplit(":", 1)[1])
        client = socket.create_connection(("127.0.0.1", port))  # loopback: the kernel completes it at once
        client.sendall(request)
        for _ in range(steps):
            await asyncio.sleep(0)  # one loop step each (a yield, not a wait): where the close lands
        await gw.close()
        return client

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        outcomes = []
        for steps in range(8):
            loop = LoopThread()
            try:
                client = loop.call(connect_then_close(_gateway(tokenizer), steps))
            finally:
                loop.close()
            client.settimeout(HANG_S)
            try:
                outcomes.append("answered" if client.recv(4096) else "closed")
            except ConnectionResetError:
                outcomes.append(
                    "reset"
                )  # refused from the listener's queue, or closed with the request unread
            except TimeoutError:
                pytest.fail(
                    f"close after {steps} loop steps: a connection the gateway accepted is still open and its "
                    f"request unanswered {HANG_S:g} s after the run's loop closed (outcomes so far: {outcomes})"
                )
            finally:
                client.close()
        assert set(outcomes) - {"reset"}, outcomes  # the sweep reaches past the accept
    finally:
        if was_enabled:
            gc.enable()


async def test_a_claim_waiting_for_a_task_is_answered_410_when_the_gateway_closes(tokenizer) -> None:
    """A long-poll claim in flight when the run ends is answered at once with 410 (the run is over: the agent
    stops), and a claim after that too. Mutant: Board.close not waking the waiting claim (the old close) answers
    it 204 only when its wait_s runs out, or cuts it when the shutdown's grace period ends."""
    gw = _gateway(tokenizer)
    url = await gw.start()
    headers = {"Authorization": f"Bearer {EXTERNAL}"}
    async with aiohttp.ClientSession() as http:
        claiming = asyncio.ensure_future(
            http.post(url + "/tasks/claim", json={"wait_s": 60}, headers=headers)
        )
        while not gw.board.waiting:  # the claim is parked on the board, waiting for a task
            await asyncio.sleep(0)
        closing = asyncio.ensure_future(gw.close())
        r = await asyncio.wait_for(claiming, HANG_S)
        assert r.status == 410, await r.text()
        assert "ended" in (await r.json())["error"]["message"]
        r.release()
        await asyncio.wait_for(closing, HANG_S)
