"""Example rewards: ``gsm8k`` (answer extraction, optional simulated latency) and ``llm_judge`` (an
OpenAI-compatible judge). Use them by file path or, installed, as ``pkg://verl_async_rm.user_rewards.<name>``."""
