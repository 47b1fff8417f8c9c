"""The CPU rollout server's sleep/wake state and its determinism, in process (no Ray): what lets the
trainer tests see replicas left awake during training, and compare two runs on their parameters."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from omegaconf import OmegaConf

from verl_async_rm_rig.cpu_backend.names import REPLICA_LOG_ENV
from verl_async_rm_rig.cpu_backend.server import HFCPUServer, ServerSettings
from verl_async_rm_rig.cpu_backend.tiny_model import build_tiny_model

pytestmark = pytest.mark.local
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 6}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("model")))


def server(model_dir, free_cache_engine=True) -> HFCPUServer:
    config = OmegaConf.create({"seed": 7, "max_model_len": None, "prompt_length": 32, "response_length": 6,
                               "max_num_seqs": 64, "ignore_eos": True, "free_cache_engine": free_cache_engine})
    return HFCPUServer(ServerSettings.read(config, OmegaConf.create({"path": model_dir})))


PROMPTS = [[1, 87, 85, 201], [1, 87, 85, 259, 201, 288], [1, 90, 91]]


async def generate_all(srv: HFCPUServer, order: list[int], ids: list[str]) -> dict[str, list[int]]:
    async def one(i):
        await asyncio.sleep(random.random() * 0.01)  # arrival order and batching vary
        out = await srv.generate(ids[i], PROMPTS[i % len(PROMPTS)], SAMPLING)
        return ids[i], out.token_ids

    return dict(await asyncio.gather(*(one(i) for i in order)))


async def generate_in_turn(srv: HFCPUServer, order: list[int], ids: list[str]) -> dict[str, list[int]]:
    """One request at a time, in ``order``: a fixed arrival order, each request a batch of its own."""
    return {ids[i]: (await srv.generate(ids[i], PROMPTS[i % len(PROMPTS)], SAMPLING)).token_ids for i in order}


def test_deterministic_requests_reproduce_whatever_their_arrival_order(model_dir):
    ids = [f"det-{i}" for i in range(8)]

    async def run(order):
        srv = server(model_dir)
        await srv.set_global_steps(3)
        first = await generate_all(srv, order, ids)
        again = await generate_all(srv, order, ids)  # same ids, same weights: the next occurrence
        return first, again

    first, again = asyncio.run(run(list(range(8))))
    first_shuffled, again_shuffled = asyncio.run(run(random.Random(1).sample(range(8), 8)))
    assert first == first_shuffled and again == again_shuffled
    assert first != again  # a repeated id (off-policy: two batches per weight version) samples anew
    assert len({tuple(v) for v in first.values()}) > 1


def test_sleep_and_wake_are_state_and_logged(model_dir, tmp_path, monkeypatch):
    log = tmp_path / "replica.jsonl"
    monkeypatch.setenv(REPLICA_LOG_ENV, str(log))

    async def scenario():
        srv = server(model_dir)
        await srv.generate("a", PROMPTS[0], SAMPLING)  # a fresh engine is awake
        await srv.sleep()
        with pytest.raises(RuntimeError, match="while asleep"):
            await srv.generate("b", PROMPTS[0], SAMPLING)
        await srv.wake_up(tags=["weights"])
        with pytest.raises(RuntimeError, match="while asleep"):  # weights back, KV cache still freed
            await srv.generate("c", PROMPTS[0], SAMPLING)
        state = dict(srv.model.state_dict())
        await srv.update_weights(state, global_steps=1)
        await srv.wake_up(tags=["kv_cache"])
        await srv.generate("d", PROMPTS[0], SAMPLING)
        await srv.update_weights(state, global_steps=2)  # no sleep in between: training beside awake replicas
        return await srv.get_state()

    assert asyncio.run(scenario())["awake"] == ["kv_cache", "weights"]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events] == [
        "sleep", "generate_while_asleep", "wake_up", "generate_while_asleep", "update_weights", "wake_up", "update_weights",
    ]
    assert [e["sleeps_since_update"] for e in events if e["event"] == "update_weights"] == [1, 0]


def test_without_free_cache_engine_sleep_frees_nothing_as_in_verls_vllm_server(model_dir):
    async def scenario():
        srv = server(model_dir, free_cache_engine=False)
        await srv.sleep()
        await srv.generate("a", PROMPTS[0], SAMPLING)
        return srv.sleeps_since_update

    assert asyncio.run(scenario()) == 0


def test_lengths_vary_and_each_response_arrives_when_it_is_done(model_dir, monkeypatch):
    """Real decoding: responses differ in length and a short one is not held back by a long one
    in the same batch (the strategies score each sample as its rollout finishes)."""
    from verl_async_rm_rig.cpu_backend.names import DECODE_S_ENV
    from verl_async_rm_rig.cpu_backend.server import MIN_LENGTH_FRACTION

    monkeypatch.setenv(DECODE_S_ENV, "0.005")  # 5 ms per token
    sampling = {**SAMPLING, "max_tokens": 12}

    async def scenario():
        srv = server(model_dir)
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(i):
            out = await srv.generate(f"det-{i}", PROMPTS[i % 3], sampling)
            return len(out.token_ids), loop.time() - start

        return await asyncio.gather(*(one(i) for i in range(6)))

    done = asyncio.run(scenario())
    lengths = [n for n, _ in done]
    assert len(set(lengths)) > 1 and min(lengths) >= 12 * MIN_LENGTH_FRACTION and max(lengths) <= 12
    # deterministic requests are sampled one by one; within that, arrival times follow lengths:
    # the total is the sum of lengths, and the first answer comes after one response, not all
    first = min(t for _, t in done)
    assert first < 0.5 * max(t for _, t in done)
    assert lengths == [n for n, _ in asyncio.run(scenario())]  # same seed, same lengths


def test_a_batch_delivers_each_row_as_it_finishes(model_dir, monkeypatch):
    from verl_async_rm_rig.cpu_backend.names import DECODE_S_ENV

    monkeypatch.setenv(DECODE_S_ENV, "0.02")
    sampling = {**SAMPLING, "max_tokens": 12}

    async def scenario():
        srv = server(model_dir)  # non-deterministic ids: one batch for all
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(i):
            out = await srv.generate(f"r{i}", PROMPTS[i % 3], sampling)
            return len(out.token_ids), loop.time() - start

        return await asyncio.gather(*(one(i) for i in range(8)))

    done = sorted(asyncio.run(scenario()))
    assert done[0][0] < done[-1][0]
    # the shortest response was answered well before the longest (same batch, 20 ms per token)
    assert done[-1][1] - done[0][1] >= 0.02 * (done[-1][0] - done[0][0]) * 0.5


def test_paired_draws_give_two_runs_the_same_samples_for_the_same_prompt(model_dir, monkeypatch):
    """The e2e benchmark's common random numbers (PAIRED_DRAWS_ENV): a request's draws depend on
    its prompt and how often that prompt was sampled, not on the weight version, the request id,
    the arrival order or the batch; requests are still batched; and two runs whose weights differ
    a little (a strategy's policy lag) mostly sample the same responses, where unpaired runs don't."""
    import torch

    from verl_async_rm_rig.cpu_backend import server as server_module
    from verl_async_rm_rig.cpu_backend.names import PAIRED_DRAWS_ENV

    batch_sizes = []
    real_sample_batch = server_module.sample_batch

    def recording(model, prompts, *args, **kwargs):
        batch_sizes.append(len(prompts))
        return real_sample_batch(model, prompts, *args, **kwargs)

    monkeypatch.setattr(server_module, "sample_batch", recording)
    order = list(range(12))  # 4 samples of each of the 3 prompts, as a GRPO group

    async def run(version: int, order: list[int], ids: list[str], nudge: float = 0.0,
                  in_turn: bool = False) -> dict[int, list]:
        srv = server(model_dir)
        await srv.set_global_steps(version)
        if nudge:
            with torch.no_grad():
                for p in srv.model.parameters():
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * nudge)
        out = await (generate_in_turn if in_turn else generate_all)(srv, order, ids)
        by_prompt: dict[int, list] = {}
        for i in order:
            by_prompt.setdefault(i % len(PROMPTS), []).append(tuple(out[ids[i]]))
        return {k: sorted(v) for k, v in by_prompt.items()}

    def shared(a: dict, b: dict) -> float:
        return sum(len(set(a[k]) & set(b[k])) for k in a) / len(order)

    monkeypatch.setenv(PAIRED_DRAWS_ENV, "1")
    ids = [f"req-{i}" for i in range(12)]
    first = asyncio.run(run(3, order, ids))
    assert max(batch_sizes) > 1  # batched as usual, not one by one as det- requests
    other_ids = [f"other-{i}" for i in range(12)]
    assert asyncio.run(run(5, random.Random(2).sample(order, 12), other_ids)) == first
    assert len({s for v in first.values() for s in v}) > 6  # and a group's members still differ
    paired_lag = shared(first, asyncio.run(run(3, order, ids, nudge=1e-3)))
    monkeypatch.delenv(PAIRED_DRAWS_ENV)
    # Unpaired, a request takes the server's stream where it stands when the request is sampled. With
    # jittered arrivals the share between two runs is then a coincidence of arrival positions (the
    # random tiny model samples nearly the same tokens at a position whatever the prompt: 0.0-0.75
    # seen, load-dependent), so here requests arrive one at a time, the second run's shifted by one
    # so that no position keeps its prompt: unpaired, (almost) nothing is shared; had the draws been
    # paired after all, everything would be, as paired_lag shows.
    unpaired = asyncio.run(run(3, order, ids, in_turn=True))
    unpaired_lag = shared(unpaired, asyncio.run(run(3, order[1:] + order[:1], ids, nudge=1e-3, in_turn=True)))
    assert paired_lag >= 0.75 and unpaired_lag <= 0.25, (paired_lag, unpaired_lag)
