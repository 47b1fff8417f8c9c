"""Rewards for tests/agent/test_core_attacks.py that must be loadable by file path (process workers)."""

import os
import time


def crashes_on_request(data_source, solution_str, ground_truth, extra_info=None):
    """Kills its own worker process on the sample whose text is "crash" (a segfault's effect)."""
    if solution_str == "crash":
        os._exit(13)
    time.sleep(0.001)
    return float(len(solution_str))
