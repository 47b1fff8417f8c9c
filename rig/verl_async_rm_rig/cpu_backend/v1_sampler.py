"""Optional v1 sampler: verl's own sync ``ReplayBuffer`` with a shorter TransferQueue poll.

verl 0.9.1's v1 trainer waits for rollouts by polling every 2.0 s (``ReplayBuffer.poll_interval``,
not exposed in the config), so on CPU, where a step's rollout takes ~0.3 s, every v1 step takes
at least 2 s, which would swamp timing comparisons. verl's supported hook for this is a custom
sampler (``trainer.v1.sampler.custom_sampler.{path,name}``); custom samplers are built with the
base kwargs only, so this subclass restores what verl passes its built-in sync sampler when DAPO
group filtering is off. The launcher enables it only on request (``v1_poll_interval_s``) and
refuses it together with ``algorithm.filter_groups``.

verl loads this file by path, so it imports verl directly and nothing relative.
"""

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer


class FastPollReplayBuffer(ReplayBuffer):
    def __init__(self, *, trainer_mode, sampler_kwargs, **kwargs):
        if trainer_mode != "sync":
            raise ValueError(f"FastPollReplayBuffer is verl's sync sampler; trainer.v1.trainer_mode={trainer_mode!r}")
        opts = dict(sampler_kwargs or {})
        batch = int(opts["train_batch_size"])
        super().__init__(
            trainer_mode=trainer_mode,
            sampler_kwargs=sampler_kwargs,
            poll_interval=float(opts.get("poll_interval", 0.05)),
            filter_groups_metric=None,
            sync_refill_failed_groups=False,
            train_batch_size=batch,
            gen_batch_size=batch,
            max_inflight_gen_batches=1,
            **kwargs,
        )
