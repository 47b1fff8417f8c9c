"""verl's v0 TaskRunner with the strategies' trainer and workers.

verl hard-codes ``RayPPOTrainer`` and the worker classes inside ``main_ppo_v0.TaskRunner``; this
subclass swaps them in its own Ray actor process only (verl's files are untouched).
"""

from __future__ import annotations

import ray

from verl.trainer import main_ppo_v0
from verl.trainer.ppo.ray_trainer import Role
from verl_async_rm.strategies.v0 import AsyncRewardRayPPOTrainer
from verl_async_rm.strategies.workers import AsyncRewardActorRolloutRefWorker, AsyncRewardTrainingWorker
from verl_async_rm.verl_compat import require_verl

require_verl(
    "the async reward strategies (v0)",
    (
        ("verl.trainer.main_ppo_v0", "TaskRunner"),
        ("verl.trainer.main_ppo_v0", "BaseTaskRunner"),
        ("verl.trainer.main_ppo_v0", "RayPPOTrainer"),
    ),
)
# verl's TaskRunner is a Ray actor class; subclassing its underlying class breaks its zero-argument
# super() once Ray ships the class to a worker. So: subclass the plain base, borrow run().
_verl_run = main_ppo_v0.TaskRunner.__ray_actor_class__.run


class AsyncRewardTaskRunner(main_ppo_v0.BaseTaskRunner):
    def add_actor_rollout_worker(self, config):
        _, group_cls = super().add_actor_rollout_worker(config)
        for role in (Role.ActorRollout, Role.ActorRolloutRef):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(AsyncRewardActorRolloutRefWorker)
        return AsyncRewardActorRolloutRefWorker, group_cls

    def add_critic_worker(self, config):
        super().add_critic_worker(config)
        if Role.Critic in self.role_worker_mapping:
            self.role_worker_mapping[Role.Critic] = ray.remote(AsyncRewardTrainingWorker)

    def run(self, config):
        main_ppo_v0.RayPPOTrainer = AsyncRewardRayPPOTrainer  # this actor's process only
        return _verl_run(self, config)


AsyncRewardTaskRunnerActor = ray.remote(AsyncRewardTaskRunner)
