"""Park embedded engine *server processes* mid-turn, for tests/push_mid_turn.py::push_mid_turn_servers.

Python imports this module at the start of every process that has this folder on PYTHONPATH. It acts only in
an `agent_rl.engines.embedded.server` process started with AGENT_RL_TEST_PARK=PATH: while the file PATH exists
(the learner is not waiting for groups), the engine takes no step once a running request has sampled a
token (commands such as pause still run), so every weight push finds turns in flight. A watcher thread
wakes the engine when the file goes away. Only the order of engine steps is constrained.
"""

import os
import sys

_PARK = os.environ.get("AGENT_RL_TEST_PARK")
if _PARK and "agent_rl.engines.embedded.server" in getattr(sys, "orig_argv", ()):
    import threading

    from agent_rl.engines.embedded.engine import EmbeddedEngine
    from agent_rl.engines.embedded.scheduler import Scheduler

    _engines: list = []
    _has_work = Scheduler.has_work
    _init = EmbeddedEngine.__init__

    def _parked_has_work(self) -> bool:
        if os.path.exists(_PARK) and any(r.tokens for r in self.running):
            return False
        return _has_work(self)

    def _recording_init(self, *args, **kwargs) -> None:
        _init(self, *args, **kwargs)
        _engines.append(self)

    def _watch() -> None:
        parked = True
        while True:
            now = os.path.exists(_PARK)
            if parked and not now:
                for engine in _engines:
                    engine.submit(lambda: None)  # wake the engine thread
            parked = now
            threading.Event().wait(0.002)

    Scheduler.has_work = _parked_has_work
    EmbeddedEngine.__init__ = _recording_init
    threading.Thread(target=_watch, daemon=True).start()
