"""Optional v1 samplers: verl's own ``ReplayBuffer`` (sync) and ``ReplayBufferAsync`` (its async
trainer modes) with a shorter TransferQueue poll.

verl 0.9.1's v1 trainer waits for rollouts by polling every 2.0 s (``ReplayBuffer.poll_interval``,
not exposed in the config), so on CPU, where a step's rollout takes ~0.3 s, every v1 step takes
at least 2 s, which would swamp timing comparisons. verl's supported hook for this is a custom
sampler (``trainer.v1.sampler.custom_sampler.{path,name}``); custom samplers are built with the
base kwargs only, so each subclass restores what verl passes its built-in sampler for the mode when
DAPO group filtering is off, and changes nothing but the poll interval (sampling, staleness
``max_off_policy_threshold`` with ``drop``/``wait``, eviction and refill stay verl's). The launcher
picks the one for the run's ``trainer.v1.trainer_mode`` only on request (``v1_poll_interval_s``) and
refuses it together with ``algorithm.filter_groups``.

verl loads this file by path, so it imports verl directly and nothing relative.
"""

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

DEFAULT_POLL_INTERVAL_S = 0.05


def _poll_interval(sampler_kwargs) -> float:
    return float(dict(sampler_kwargs or {}).get("poll_interval", DEFAULT_POLL_INTERVAL_S))


class FastPollReplayBuffer(ReplayBuffer):
    """verl's sync sampler (``trainer.v1.trainer_mode=sync``)."""

    def __init__(self, *, trainer_mode, sampler_kwargs, **kwargs):
        if trainer_mode != "sync":
            raise ValueError(
                f"FastPollReplayBuffer is verl's sync sampler; trainer.v1.trainer_mode={trainer_mode!r} "
                "takes FastPollReplayBufferAsync"
            )
        batch = int(dict(sampler_kwargs or {})["train_batch_size"])
        super().__init__(
            trainer_mode=trainer_mode,
            sampler_kwargs=sampler_kwargs,
            poll_interval=_poll_interval(sampler_kwargs),
            filter_groups_metric=None,
            sync_refill_failed_groups=False,
            train_batch_size=batch,
            gen_batch_size=batch,
            max_inflight_gen_batches=1,
            **kwargs,
        )


class FastPollReplayBufferAsync(ReplayBufferAsync):
    """verl's async sampler (``trainer.v1.trainer_mode=colocate_async``; ``separate_async`` too, were
    it to run on CPU)."""

    def __init__(self, *, trainer_mode, sampler_kwargs, **kwargs):
        if trainer_mode == "sync":
            raise ValueError(
                "FastPollReplayBufferAsync is verl's async sampler; trainer.v1.trainer_mode='sync' takes FastPollReplayBuffer"
            )
        super().__init__(
            trainer_mode=trainer_mode,
            sampler_kwargs=sampler_kwargs,
            poll_interval=_poll_interval(sampler_kwargs),
            filter_groups_metric=None,
            sync_refill_failed_groups=False,
            **kwargs,
        )
