"""Names shared by the launcher, the plugin hook and the rollout (no verl/Ray import here)."""

ROLLOUT_NAME = "hf_cpu"
# Negative control for weight sync: when set, the adapter drops every update so the rollout keeps
# its initial weights and rollout/trainer log-probs drift apart (training/rollout_probs_diff_*).
NO_WEIGHT_SYNC_ENV = "VERL_ASYNC_RM_CPU_NO_WEIGHT_SYNC"
# Path of a JSONL file the rollout server appends its sleep/wake/weight-update transitions to.
REPLICA_LOG_ENV = "VERL_ASYNC_RM_CPU_REPLICA_LOG"
# Seconds of simulated decode time per generated token (a GPU's), so that responses of different
# lengths finish at different times as on real hardware (default 0: the tiny model's own speed).
DECODE_S_ENV = "VERL_ASYNC_RM_CPU_DECODE_S"
# Seconds each weight update takes (a GPU's weight sync takes seconds; the tiny model's ~1 ms). verl's
# FullyAsyncLLMServerClient waits 1 s before re-sending an aborted request: when the step and its
# update take less, the next step's fresh batch is queued before the resumed requests and overtakes
# them, step after step, which a GPU trainer's step never lets happen.
WEIGHT_SYNC_S_ENV = "VERL_ASYNC_RM_CPU_WEIGHT_SYNC_S"
# When set ("1"), every sampled request draws its tokens and length from a generator of its own,
# seeded by (seed, prompt, sampling parameters, how often this server sampled that prompt), and is
# still batched with the others. Two runs that sample the same prompt then draw the same random
# numbers whatever their weights, timing or batch composition (common random numbers), so a
# benchmark's paired learning comparison measures the strategy rather than two sampling draws.
PAIRED_DRAWS_ENV = "VERL_ASYNC_RM_CPU_PAIRED_DRAWS"
# "1": our entry point, as the launcher runs it (entry.py), drives the run without importing verl (light_driver.py).
LIGHT_DRIVER_ENV = "VERL_ASYNC_RM_LIGHT_DRIVER"
ADAPTER_FQN = "verl_async_rm_rig.cpu_backend.rollout.HFServerAdapter"


def server_actor_name(replica_rank: int, node_rank: int = 0, kind: str = "") -> str:
    return f"{ROLLOUT_NAME}_server{kind}_{replica_rank}_{node_rank}"
