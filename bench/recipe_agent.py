"""A faithful reimplementation of the recipe's RayAsyncRewardAgent, from its published description
(../shared/reference/002_*.txt, "Reward Agent"), minus Ray, for side-by-side benchmarks only.

Its design: a thread pool of 256; a proxy thread that takes a request from ``pending_queue``,
submits every sample to the pool, collects them with ``as_completed`` and puts each finished group
on ``completed_queue``, sleeping 1 s whenever the pending queue is empty; ``get(chunk_size)``
polls ``completed_queue`` every 0.1 s until it has ``chunk_size`` samples, then sorts them.

One addition for the benchmark, outside the design: ``picked_up_at`` (``time.perf_counter()`` when
the proxy thread takes a request off ``pending_queue``), so a batch can be timed from the moment the
design starts working on it ("pickup") as well as from submit.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from queue import Queue

import numpy as np


class RecipeRewardAgent:
    def __init__(self, compute_score, max_concurrency: int = 256):
        self.compute_score = compute_score
        self.executor = ThreadPoolExecutor(max_workers=max_concurrency)
        self.pending_queue: Queue = Queue()
        self.completed_queue: Queue = Queue()
        self.running = True
        self.picked_up_at: float | None = None  # benchmark instrumentation, not part of the design
        self.proxy_thread = threading.Thread(target=self.proxy_func, daemon=True)
        self.proxy_thread.start()

    def compute_reward_pipeline(self, items: list[dict], group_size: int = 1) -> int:
        group_dict: dict = {}
        for idx, item in enumerate(items):
            group = group_dict.setdefault(item["uid"], [{}, 0])
            group[1] += 1
        self.pending_queue.put((items, group_dict))
        return len(items)

    def proxy_func(self) -> None:
        while self.running:
            if not self.pending_queue.empty():
                items, group_dict = self.pending_queue.get()
                self.picked_up_at = time.perf_counter()
                futures = {}
                for idx, item in enumerate(items):
                    future = self.executor.submit(
                        self.compute_score, item["data_source"], item["solution_str"], item["ground_truth"], item["extra_info"]
                    )
                    futures[future] = (item["uid"], idx)
                for future in as_completed(futures):
                    score = future.result()
                    uid, idx = futures[future]
                    group_dict[uid][0][idx] = score
                    group_dict[uid][1] -= 1
                    if group_dict[uid][1] == 0:
                        ordered = sorted(group_dict[uid][0].items())
                        self.completed_queue.put(([i for i, _ in ordered], [s for _, s in ordered]))
                        del group_dict[uid]
            else:
                time.sleep(1)

    def get(self, chunk_size: int) -> tuple[list[int], np.ndarray]:
        data_idxs: list[int] = []
        rewards: list[float] = []
        while len(data_idxs) < chunk_size:
            if self.completed_queue.empty():
                time.sleep(0.1)
                continue
            idxs, scores = self.completed_queue.get()
            data_idxs.extend(idxs)
            rewards.extend(scores)
        order = np.argsort(data_idxs)
        return [data_idxs[i] for i in order], np.asarray(rewards)[order]

    def close(self) -> None:
        self.running = False
        self.proxy_thread.join(timeout=5)
        self.executor.shutdown(wait=False, cancel_futures=True)
