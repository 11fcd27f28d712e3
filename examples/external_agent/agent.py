"""An agent that lives in its own process and trains through a run it is not part of.

    python -m examples.external_agent.agent http://127.0.0.1:8900 [--log calls.jsonl]

It claims a task from the training run's gateway (`POST /tasks/claim`), answers it with an ordinary
OpenAI function-calling loop against the session's `base_url` (a `python` tool it runs itself, in a
subprocess with a time limit), and closes the session with its final answer, which the run scores and
trains on. It only needs `openai` and the standard library: the same loop works from any language.
Started before the run, it waits for the gateway to come up (`--wait-s`); it stops when the run ends: the
gateway answers its waiting claim 410 as it closes (or, failing that, stops answering). It claims with the external agents' key ($AGENT_RL_EXTERNAL_AGENT_KEY, the value `agent-rl
train` was started with; never the run's own key) as `Authorization: Bearer`; each claim answers the session's
`api_key`, a token for that session alone, which its OpenAI client and its close send.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code and return what it prints.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
]


KEY = os.environ.get(
    "AGENT_RL_EXTERNAL_AGENT_KEY", ""
)  # opens /tasks/claim of the run's gateway, nothing else


def post(url: str, body: dict, key: str = KEY, timeout_s: float = 60.0) -> dict | None:
    """POST JSON; `timeout_s` bounds each wait on the socket (a gateway that accepts but never answers)."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read()) if r.status == 200 else None


def run_python(code: str) -> str:
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return "timed out"
    return r.stdout.strip() or (r.stderr.strip().splitlines() or [""])[-1]


def solve(client, problem: str, max_turns: int, log: list) -> str | None:
    import openai

    messages: list[dict] = [{"role": "user", "content": problem}]
    for _ in range(max_turns):
        try:
            r = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, logprobs=True)
        except openai.APIStatusError as e:  # 410: the session's budget is spent, or the run stopped it
            if e.status_code != 410:
                raise
            return None
        choice = r.choices[0]
        log.append([x.logprob for x in choice.logprobs.content])
        messages.append(choice.message.model_dump(exclude_none=True))
        if not choice.message.tool_calls:
            return choice.message.content
        for call in choice.message.tool_calls:
            try:
                out = run_python(json.loads(call.function.arguments)["code"])
            except (json.JSONDecodeError, KeyError, TypeError):
                out = "error: arguments must be a JSON object with a 'code' string"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    return None


def main(argv: list[str] | None = None) -> int:
    import openai

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gateway", help="the training run's gateway URL")
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--log", default=None, help="append each episode's received log-probs as a JSON line")
    p.add_argument("--wait-s", type=float, default=600.0, help="how long to wait for the gateway to come up")
    args = p.parse_args(argv)
    up_by = time.monotonic() + args.wait_s
    seen = False  # the gateway answered once: from then on, not reaching it means the run is over
    waiting = False
    while True:
        try:
            claim = post(args.gateway + "/tasks/claim", {"wait_s": 5}, timeout_s=5 + 30)
        except urllib.error.HTTPError as e:  # a server answered, with no task
            if e.code == 410 or seen:  # 410: the run has ended (its gateway says so as it closes)
                return 0
            print(f"{args.gateway}/tasks/claim: {e}: is this a training run's gateway?", file=sys.stderr)
            return 1
        except (urllib.error.URLError, OSError) as e:  # refused, reset, or silent past the timeout
            if seen:
                return 0  # the run is over
            if time.monotonic() > up_by:
                print(
                    f"no gateway at {args.gateway} after {args.wait_s:g} s ({e}): is the run started?",
                    file=sys.stderr,
                )
                return 1
            if not waiting:
                print(f"waiting for the gateway at {args.gateway}", flush=True)
                waiting = True
            time.sleep(0.5)  # the run is still starting (the gateway opens with its first episode)
            continue
        seen = True
        if claim is None:
            continue
        log: list = []
        close: dict = {}
        token = claim.get("api_key") or "none"  # this task's session token: its chat calls and its close
        with openai.OpenAI(base_url=claim["base_url"], api_key=token, max_retries=0, timeout=300.0) as client:
            try:
                close["answer"] = solve(client, claim["task"]["problem"], args.max_turns, log)
            except openai.APIError as e:  # engines failing, or the run shutting down: say so, never a 0
                close["error"] = repr(e)
        try:
            post(f"{args.gateway}/sessions/{claim['session_id']}/close", close, token)
        except (urllib.error.URLError, OSError):  # abandoned by the run (staleness bound), or it ended
            continue
        if args.log:
            with open(args.log, "a") as f:
                f.write(json.dumps({"session_id": claim["session_id"], "logprobs": log}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
