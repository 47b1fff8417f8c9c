"""The ``hf_cpu`` rollout server's Ray actor class, in a module that imports nothing heavy.

Ray imports an actor class's module in every process that receives a handle to the actor (to read
its methods), not only in the actor's own process. verl hands the rollout server's handle to its
router's process; had the actor class been the server's own (whose module imports torch and
transformers, and then imported verl too), that process would spend ~5 CPU-s importing them (8 with
five runs starting on 2 cores: ``bench/startup_profile.py``), only to pass the handle on. So the actor is this thin
class, and each method awaits the server's, wherever the server is:

* given ``engine_address`` (a replica whose engine the rollout adapter hosts in verl's trainer worker:
  ``engine_link``), it relays each call over that socket, and its own process imports no torch either;
* otherwise its constructor builds ``server.HFCPUServer`` in the actor's own process.
"""

from __future__ import annotations

from typing import Optional

# server.HFCPUServer's public methods (all coroutines): what verl and the adapter call on the
# server's handle (tests/rig/test_cpu_router.py checks the list against the class).
METHODS = ("generate", "update_weights", "set_global_steps", "get_state", "wake_up", "sleep", "clear_kv_cache",
           "release_kv_cache", "resume_kv_cache", "wait_for_requests_to_drain", "abort_all_requests",
           "abort_request", "resume_generation", "start_profile", "stop_profile")


class HFCPUServerActor:
    """Ray actor of one ``hf_cpu`` rollout server; the methods of :data:`METHODS` are added below."""

    def __init__(self, *args, engine_address: Optional[str] = None, **kwargs) -> None:
        if engine_address is not None:
            from .engine_link import EngineLink

            self._link, self._server = EngineLink(engine_address), None
        else:
            from .server import HFCPUServer  # torch and transformers: in this actor's process only

            self._link, self._server = None, HFCPUServer(*args, **kwargs)


def _forward(name: str):
    async def method(self, *args, **kwargs):
        if self._link is not None:
            return await self._link.call(name, *args, **kwargs)
        return await getattr(self._server, name)(*args, **kwargs)

    method.__name__ = name
    method.__qualname__ = f"HFCPUServerActor.{name}"
    return method


for _name in METHODS:
    setattr(HFCPUServerActor, _name, _forward(_name))
