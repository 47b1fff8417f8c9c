"""verl-async-rm: an asynchronous reward agent for verl.

Importing this package is light: no Ray start, no model load, no network.
"""

from verl_async_rm.agent import RewardAgent
from verl_async_rm.config import AgentConfig
from verl_async_rm.loader import RewardSpec, load_reward
from verl_async_rm.outcome import RewardError, RewardFunctionError, RewardItem, ScoredChunk
from verl_async_rm.retry import RetryableError

__all__ = [
    "AgentConfig",
    "RetryableError",
    "RewardAgent",
    "RewardError",
    "RewardFunctionError",
    "RewardItem",
    "RewardSpec",
    "ScoredChunk",
    "load_reward",
]
__version__ = "0.1.0.dev0"
