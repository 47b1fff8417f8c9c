"""Rollout ``hf_cpu``: token-in/token-out generation with Hugging Face transformers on CPU.

verl 0.9.1 rolls out only through server replicas (vLLM/SGLang/TensorRT-LLM); its old
``hf_rollout.py`` is dead code that nothing in the server path can call. The CPU backend supplies the
three pieces verl expects of a rollout backend:

* the engine the agent loop calls, ``generate(...) -> TokenOutput`` with the sampled ids, their
  log-probs and ``extra_fields["global_steps"]`` (the weight version), plus the sleep/wake, abort and
  profile control calls: ``server.HFCPUServer`` (batched sampling, determinism, paired draws, lengths
  varying per request: there);
* ``HFServerAdapter`` (here) - the ``BaseRollout`` verl builds in the trainer worker at ``init_model``.
  As verl's hybrid engine keeps vLLM's workers in the trainer's process, its leader rank hosts the
  replica's engine there (``engine_link.EngineHost``: a thread with its own loop, served on a local
  socket), and the ``naive`` checkpoint engine's full tensors reach it in process;
* ``HFCPUReplica`` (here) - ``RolloutReplica.launch_servers()`` starting the replica's Ray actor
  (``server_actor.HFCPUServerActor``), the handle verl's router and agent loop call, which relays
  to that engine and imports no torch. A colocated or standalone replica (verl's reward or teacher
  models; its adapter lives in verl's CheckpointEngineWorker) runs the engine in that actor instead.

No HTTP/OpenAI endpoint is served: ``server_address`` is only a unique id for verl's load balancer.
"""

from __future__ import annotations

import logging
import os

import ray
import torch

from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica

from .engine_link import EngineHost, engine_address
from .names import NO_WEIGHT_SYNC_ENV, ROLLOUT_NAME, server_actor_name
from .server import HFCPUServer, ServerSettings
from .server_actor import HFCPUServerActor

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------
# replica (driver side)
# ------------------------------------------------------------------------------------------------


class HFCPUReplica(RolloutReplica):
    def _kind(self) -> str:
        return "_reward" if self.is_reward_model else ("_teacher" if self.is_teacher_model else "")

    async def launch_servers(self) -> None:
        if self.nnodes != 1:
            raise NotImplementedError("hf_cpu rollout runs on one node")
        name = server_actor_name(self.replica_rank, 0, self._kind() + self.name_suffix)
        # Hybrid (verl: "rollout engine and training engine fused in same process"; the policy's
        # replicas): the engine is in the trainer worker, hosted by the adapter (built at init_model,
        # before verl launches the replicas), and this actor relays to it. Colocated or standalone (a
        # reward or teacher model's): the engine runs in this actor, built from the settings (server.py's
        # type: a relay given them would unpickle them and import torch).
        if self.rollout_mode == RolloutMode.HYBRID:
            where = {"engine_address": engine_address(self.replica_rank)}
        else:
            where = {"settings": ServerSettings.read(self.config, self.model_config), "replica_rank": self.replica_rank}
        server = (
            ray.remote(HFCPUServerActor)  # HFCPUServer behind a class whose module imports nothing heavy
            .options(
                name=name,
                # No CPU reservation: verl's workers already hold the (fake) GPU bundles, and a
                # reservation here could leave the actor pending on a 2-core box.
                num_cpus=0,
                max_concurrency=self.max_concurrency,
            )
            .remote(**where)
        )
        await server.get_state.remote()  # surface constructor and link errors here, not at the first request
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"{ROLLOUT_NAME}://{name}"


# ------------------------------------------------------------------------------------------------
# adapter (inside the trainer worker)
# ------------------------------------------------------------------------------------------------


class HFServerAdapter(BaseRollout):
    """The trainer worker's end of ``hf_cpu``: its leader rank hosts the replica's engine; verl
    builds it via ``get_rollout_class``."""

    def __init__(self, config, model_config, device_mesh=None, replica_rank: int = -1, **kwargs) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % rollout_world_size
        self.is_leader_rank = self.rollout_rank == 0
        self.sync_disabled = os.environ.get(NO_WEIGHT_SYNC_ENV, "0") == "1"
        if self.sync_disabled and self.is_leader_rank:
            logger.warning("%s=1: rollout weights will NOT follow the trainer (negative control)", NO_WEIGHT_SYNC_ENV)
        # verl builds this adapter in its trainer worker with a device mesh (hybrid: the replica's
        # actor relays to the engine hosted here) and in its CheckpointEngineWorker without one
        # (colocated or standalone replicas, whose engine runs in the replica's actor, reached by name).
        self.engine: EngineHost | None = None
        self._server = None
        if self.is_leader_rank and device_mesh is not None:
            settings, replica = ServerSettings.read(self.config, self.model_config), self.replica_rank
            # num_threads=None: the worker's torch threads stand (training shares them)
            self.engine = EngineHost(lambda: HFCPUServer(settings, replica, num_threads=None), engine_address(replica))

    async def _call_engine(self, method: str, *args, **kwargs):
        if self.engine is not None:
            return await self.engine.call(method, *args, **kwargs)
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank, 0))
        return await getattr(self._server, method).remote(*args, **kwargs)

    async def resume(self, tags: list[str]):
        """As verl's vLLM adapter: wake the server's weights or KV cache (state only on CPU)."""
        if self.config.free_cache_engine and self.is_leader_rank:
            await self._call_engine("wake_up", tags=tags)

    async def release(self):
        if self.config.free_cache_engine and self.is_leader_rank:
            await self._call_engine("sleep")

    @torch.no_grad()
    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps=None, **kwargs):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf_cpu rollout takes full tensors, not wire_format={wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("hf_cpu rollout does not load LoRA adapters; set model.lora.merge=True")
        from verl.workers.rollout.utils import ensure_async_iterator

        # Every rank must drain the generator: under FSDP each item is a collective full_tensor().
        state_dict = {}
        async for name, tensor in ensure_async_iterator(weights):
            if self.is_leader_rank and not self.sync_disabled:
                state_dict[name] = tensor.detach().to("cpu", copy=True).contiguous()
        if not self.is_leader_rank:
            return
        if self.sync_disabled:
            if global_steps is not None:  # keep the version tag moving so only the weights are stale
                await self._call_engine("set_global_steps", global_steps)
            return
        await self._call_engine("update_weights", state_dict, global_steps)
