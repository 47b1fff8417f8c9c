"""One job of the shared-limits cluster test (tests/judge_ops/test_shared_limits_cluster.py), as its own driver:
connects to the cluster, and scores ``--samples`` samples with the example ``JudgeReward`` (real
``openai`` client) against the loopback judge, in a Ray task pinned to node ``--node`` (so the two
jobs' agents run on different raylets), with ``shared_limits`` on. Both jobs start scoring together
(a file barrier). Prints one JSON line: scores, metrics, active window (wall clock)."""

from __future__ import annotations

import argparse
import json
import os
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def score(base_url: str, samples: int, config: dict, barrier: str, job: int, jobs: int) -> dict:
    from verl_async_rm import RewardAgent

    items = [{"solution_str": f"so the answer is {i % 7}", "ground_truth": i % 7, "uid": i} for i in range(samples)]
    with RewardAgent.from_file("pkg://verl_async_rm.user_rewards.llm_judge", "JudgeReward", config,
                               reward_kwargs={"base_url": base_url, "model": "judge-stub"}) as agent:
        open(os.path.join(barrier, f"ready-{job}"), "w").close()
        deadline = time.time() + 300
        while sum(os.path.exists(os.path.join(barrier, f"ready-{j}")) for j in range(jobs)) < jobs:
            if time.time() > deadline:
                raise TimeoutError("the other job never became ready")
            time.sleep(0.05)
        start = time.time()
        chunk = agent.get_all(agent.submit(items))
        end = time.time()
        metrics = agent.metrics()
    return {"scores": chunk.scores, "start": start, "end": end, "node": ray.get_runtime_context().get_node_id(),
            "failed": metrics["failed"], "shared_heartbeats": metrics.get("shared_heartbeats")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--address", required=True)
    p.add_argument("--base-url", required=True)
    p.add_argument("--node", type=int, required=True)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--config", required=True, help="AgentConfig as JSON")
    p.add_argument("--barrier", required=True, help="a directory both jobs see")
    a = p.parse_args()
    ray.init(address=a.address, log_to_driver=False, namespace=f"shared_limits_job_{a.node}")
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    task = ray.remote(num_cpus=1)(score).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[a.node % len(nodes)], soft=False))
    result = ray.get(task.remote(a.base_url, a.samples, json.loads(a.config), a.barrier, a.node, a.jobs), timeout=600)
    print(json.dumps(result), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
