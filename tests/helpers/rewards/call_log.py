"""The toy task's reward, appending one line per call to a file: which Ray actor ran it, and the
sample's split and index (so a test can check who scored every sample, across processes)."""

import ray

from verl_async_rm_rig.cpu_backend.toy_task import compute_score as toy_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, call_log=None):
    actor = ray.get_runtime_context().get_actor_name() if ray.is_initialized() else None
    info = extra_info or {}
    with open(call_log, "a") as f:
        f.write(f"{actor}\t{info.get('split')}\t{info.get('index')}\n")
    return toy_score(data_source, solution_str, ground_truth, extra_info)
