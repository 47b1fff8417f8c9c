"""The rollout router of CPU runs: verl's routing, without importing verl in the router's process.

verl runs its rollout load balancer (``GlobalRequestLoadBalancer`` in ``verl/workers/rollout/router.py``)
as a Ray actor of its own. That module imports ``verl`` (``verl.protocol`` -> tensordict -> torch), so
the actor's process spends ~5 CPU-s of a run's ~40 CPU-s start-up importing before it routes a
single request (``bench/startup_profile.py``); the demo starts five runs on 2 cores. verl's public
plugin point, ``actor_rollout_ref.rollout.router_config_path`` (a YAML naming ``router_class``, built
as ``router_class(servers, yaml_config)``), takes this class instead: it imports only the standard
library and cachetools (verl's own dependency, for the same LRU verl uses). Its process also imports
the class module of the server handles verl passes it (Ray does, for every actor handle), hence the
server's light actor class in ``server_actor.py``: together they keep that process free of verl and
torch. The launcher sets it for every CPU run (stock verl and the strategies alike).

Routing is verl's: a request id seen before goes back to its server (sticky sessions, for
multi-turn agent loops), else to the server with the fewest requests in flight. One difference:
verl breaks a tie at random; this takes the first registered, so a run does not depend on a random
draw (on the CPU backend, with its single server, no tie ever arises). verl forwards
``rollout.full_determinism`` only to its own class, not to plugins; first-registered tie-breaking
keeps routing deterministic for a given arrival order.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from cachetools import LRUCache

DEFAULT_ROUTING_CACHE_SIZE = 10000  # verl's DEFAULT_ROUTING_CACHE_SIZE
CONFIG_FILE = "router.yaml"  # beside this module; names this class (the launcher passes its path)


def config_path() -> str:
    """The absolute path of the YAML that makes verl build :class:`LightLoadBalancer` (verl resolves
    absolute paths as they are, in whichever process builds the router)."""
    return str(files(__package__).joinpath(CONFIG_FILE))


class LightLoadBalancer:
    """verl's ``RequestLoadBalancer`` protocol (``verl/workers/rollout/router.py``): sticky sessions
    plus least-in-flight selection, as verl's ``GlobalRequestLoadBalancer``."""

    def __init__(self, servers: dict[str, Any], yaml_config: dict | None = None):
        cache_size = int((yaml_config or {}).get("max_cache_size", DEFAULT_ROUTING_CACHE_SIZE))
        self._servers: dict[str, Any] = dict(servers)
        self._inflight: dict[str, int] = {server_id: 0 for server_id in servers}
        self._sticky: LRUCache = LRUCache(maxsize=cache_size)

    def acquire_server(self, request_id: str, **extra) -> tuple[str, Any]:
        server_id = self._sticky.get(request_id)
        if server_id is not None and server_id not in self._inflight:
            del self._sticky[request_id]  # its server was removed since
            server_id = None
        if server_id is None:
            if not self._inflight:
                raise RuntimeError("No available servers in load balancer")
            server_id = min(self._inflight, key=self._inflight.__getitem__)  # first registered on a tie
            self._sticky[request_id] = server_id
        self._inflight[server_id] += 1
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        if self._inflight.get(server_id, 0) > 0:  # a removed server, or a release without acquire
            self._inflight[server_id] -= 1

    def require_acquire_fields(self) -> list[str]:
        return []  # routes on the request id alone

    def require_release_fields(self) -> list[str]:
        return []  # counts by server id

    def add_servers(self, servers: dict[str, Any]) -> None:
        for server_id, handle in servers.items():
            self._inflight[server_id] = 0
            self._servers[server_id] = handle

    def remove_servers(self, server_ids: list[str]) -> None:
        for server_id in server_ids:
            self._inflight.pop(server_id, None)
            self._servers.pop(server_id, None)

    def get_all_servers(self) -> list[str]:
        return list(self._inflight)

    def get_inflight_count(self, server_id: str) -> int:
        return self._inflight.get(server_id, 0)

    def clear_sticky_cache(self) -> dict:
        cleared = len(self._sticky)
        self._sticky.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_status(self) -> dict:
        return {"servers": dict(self._inflight), "total_inflight": self.get_total_inflight(),
                "active_servers": len(self._inflight), "registered_handles": list(self._servers)}

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())
