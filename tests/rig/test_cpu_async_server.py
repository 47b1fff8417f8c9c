"""The ``hf_cpu`` server's partial rollouts, in process (no Ray, no trainer): what verl's async trainer
modes (``colocate_async``) need of a rollout server, as its vLLM server does it.

At each sample verl aborts the replicas (``abort_all_requests``), puts them to sleep, updates the
weights, wakes them and resumes generation; its ``FullyAsyncLLMServerClient`` re-submits every
aborted request as prompt + the tokens it had, with the rest of the budget, so the agent loop never
sees the interruption. These tests drive verl's own client against the server, and race the abort
against generation many times (aborts land anywhere: before a batch starts, mid-batch, after rows
finished)."""

from __future__ import annotations

import asyncio
import json
import pickle
import random
import types

import pytest
import torch
from omegaconf import OmegaConf

from verl_async_rm_rig.cpu_backend.names import DECODE_S_ENV, REPLICA_LOG_ENV
from verl_async_rm_rig.cpu_backend.server import HFCPUServer, ServerSettings
from verl_async_rm_rig.cpu_backend.tiny_model import build_tiny_model

pytestmark = pytest.mark.local
MAX_TOKENS = 10
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
PROMPTS = [[1, 87, 85, 201], [1, 87, 85, 259, 201, 288], [1, 90, 91]]
DECODE_S = 0.002  # per token: long enough that an abort finds rows mid-way, short enough for the quick tier


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(autouse=True)
def decode_time(monkeypatch):
    monkeypatch.setenv(DECODE_S_ENV, str(DECODE_S))


def server(model_dir) -> HFCPUServer:
    config = OmegaConf.create({"seed": 7, "max_model_len": None, "prompt_length": 32, "response_length": MAX_TOKENS,
                               "max_num_seqs": 64, "ignore_eos": True, "free_cache_engine": True})
    return HFCPUServer(ServerSettings.read(config, OmegaConf.create({"path": model_dir})))


class _Remote:
    def __init__(self, method):
        self.method = method

    async def remote(self, *args, **kwargs):
        # as through Ray: the answer unpickles as verl's TokenOutput
        return pickle.loads(pickle.dumps(await self.method(*args, **kwargs)))


def verl_client(srv: HFCPUServer, monkeypatch, deterministic: bool):
    """verl's FullyAsyncLLMServerClient (the resume loop colocate_async's agent loops call) routed to
    ``srv``; its 1 s pause between an abort and the re-submission is made 0 (its loop is unchanged)."""
    from verl.workers.rollout import llm_server

    real_sleep = asyncio.sleep
    fast_asyncio = types.SimpleNamespace(**{name: getattr(asyncio, name) for name in dir(asyncio) if not name.startswith("_")})
    fast_asyncio.sleep = lambda seconds: real_sleep(0)
    monkeypatch.setattr(llm_server, "asyncio", fast_asyncio)

    class Client(llm_server.FullyAsyncLLMServerClient):
        async def _acquire_server(self, request_id, **extra):
            return "hf_cpu://0", types.SimpleNamespace(generate=_Remote(srv.generate))

        def _release_server(self, server_id, request_id=None):
            return None

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "name": "hf_cpu", "full_determinism": deterministic, "response_length": MAX_TOKENS}}})
    return Client(config=config)


async def weight_sync(srv: HFCPUServer, state: dict, version: int, *, reject: bool = False) -> dict:
    """What colocate_async does between two steps' rollouts (on_sample_end, then on_step_end)."""
    aborted = await srv.abort_all_requests(reject_request=reject)
    await srv.sleep()
    await srv.wake_up(tags=["weights"])
    await srv.update_weights(state, global_steps=version)
    await srv.wake_up(tags=["kv_cache"])
    await srv.resume_generation()
    return aborted


def nudged(srv: HFCPUServer, scale: float) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {k: v + torch.randn(v.shape, generator=generator) * scale if v.is_floating_point() else v
            for k, v in srv.model.state_dict().items()}


def test_abort_answers_every_unfinished_request_with_its_tokens_so_far(model_dir):
    """Raced 12 times at random moments: each request is answered once, either completed at its
    drawn length or aborted with fewer tokens (their log-probs beside them), and the abort's count
    and ids are exactly the aborted answers; the gate stays closed after the abort."""

    async def race(delay: float):
        srv = server(model_dir)
        await srv.set_global_steps(0)
        tasks = [asyncio.create_task(srv.generate(f"r{i}", PROMPTS[i % 3], {**SAMPLING, "max_tokens": MAX_TOKENS}))
                 for i in range(6)]
        await asyncio.sleep(delay)
        report = await srv.abort_all_requests()
        outs = await asyncio.gather(*tasks)
        return srv, report, outs

    rng = random.Random(0)
    stopped_mid_way = 0
    for _ in range(12):
        srv, report, outs = asyncio.run(race(rng.uniform(0, MAX_TOKENS * DECODE_S * 1.5)))
        aborted = [(f"r{i}", o) for i, o in enumerate(outs) if o.stop_reason == "aborted"]
        assert {o.stop_reason for o in outs} <= {"aborted", "completed"}
        assert report["aborted_count"] == len(aborted) == srv.aborted_requests
        assert sorted(report["request_ids"]) == sorted(rid for rid, _ in aborted)
        for o in outs:
            assert len(o.log_probs) == len(o.token_ids) and o.extra_fields["global_steps"] == 0
            assert len(o.token_ids) <= MAX_TOKENS
        stopped_mid_way += sum(len(o.token_ids) > 0 for _, o in aborted)
        assert (asyncio.run(srv.get_state()))["paused"]
    assert stopped_mid_way > 0  # the race did land mid-generation, not only before or after


def test_verls_client_resumes_an_aborted_request_into_the_response_it_would_have_given(model_dir, monkeypatch):
    """Deterministic requests (verl's full_determinism), aborted at random moments and resumed by
    verl's client on unchanged weights: every response is token for token the one generated without
    an abort (so its length, drawn once, is kept across the resume), and each abort has its resume."""
    ids = [f"det-{i}" for i in range(3)]

    async def serve(delay, aborts: int):
        srv = server(model_dir)
        await srv.set_global_steps(0)
        client = verl_client(srv, monkeypatch, deterministic=True)
        tasks = [asyncio.create_task(client.generate(rid, prompt_ids=PROMPTS[i % 3], sampling_params=dict(SAMPLING)))
                 for i, rid in enumerate(ids)]
        state = dict(srv.model.state_dict())
        for k in range(aborts):
            await asyncio.sleep(delay)
            await weight_sync(srv, state, version=k + 1)
        return srv, await asyncio.gather(*tasks)

    _, baseline = asyncio.run(serve(0, 0))
    rng = random.Random(1)
    resumed_mid_way = 0
    for _ in range(4):
        srv, outs = asyncio.run(serve(rng.uniform(0, 3 * MAX_TOKENS * DECODE_S), aborts=2))
        assert [o.token_ids for o in outs] == [o.token_ids for o in baseline]
        for out, base in zip(outs, baseline, strict=True):
            assert out.log_probs == pytest.approx(base.log_probs, abs=1e-5)
        assert [o.stop_reason for o in outs] == [o.stop_reason for o in baseline]
        assert srv.resumed_requests == srv.aborted_requests
        resumed_mid_way += sum(o.extra_fields["min_global_steps"] != o.extra_fields["max_global_steps"] for o in outs)
    assert resumed_mid_way > 0


def test_resumed_tokens_carry_the_new_weights_log_probs_within_the_total_budget(model_dir, monkeypatch):
    """Batched (non-deterministic) requests aborted mid-way, the weights changed, then resumed by
    verl's client: each response stays within its budget, its tokens before the abort carry the old
    weights' log-probs and those after it the new weights' (a full forward of prompt + response
    under each), and verl sees the versions it spans (min/max_global_steps)."""
    from transformers import AutoModelForCausalLM

    old_model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()

    def forward_log_probs(model, prompt, tokens):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1).tolist()

    async def serve(delay):
        srv = server(model_dir)
        await srv.set_global_steps(0)
        client = verl_client(srv, monkeypatch, deterministic=False)
        tasks = [asyncio.create_task(client.generate(f"g{i}", prompt_ids=PROMPTS[i % 3], sampling_params=dict(SAMPLING)))
                 for i in range(6)]
        await asyncio.sleep(delay)
        report = await weight_sync(srv, nudged(srv, 0.05), version=1)
        return srv, report, await asyncio.gather(*tasks)

    rng = random.Random(2)
    spanning = 0
    for _ in range(6):
        srv, report, outs = asyncio.run(serve(rng.uniform(0, MAX_TOKENS * DECODE_S)))
        new_model = srv.model
        for i, out in enumerate(outs):
            prompt = PROMPTS[i % 3]
            # "length": verl's client, once the tokens reach its budget
            assert out.stop_reason in ("completed", "length") and MAX_TOKENS // 2 <= len(out.token_ids) <= MAX_TOKENS
            steps = (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"])
            old = forward_log_probs(old_model, prompt, out.token_ids)
            new = forward_log_probs(new_model, prompt, out.token_ids)
            # the abort cut the response somewhere: the old weights' log-probs up to there, the new ones' after
            cuts = {(0, 0): [len(old)], (1, 1): [0], (0, 1): range(len(old) + 1)}[steps]
            assert any(out.log_probs == pytest.approx(old[:cut] + new[cut:], abs=1e-4) for cut in cuts), steps
            spanning += steps == (0, 1)
        assert srv.resumed_requests == report["aborted_count"]
    assert spanning > 0


def test_requests_arriving_while_paused_wait_for_the_resume_or_are_rejected(model_dir, tmp_path, monkeypatch):
    """Behind the closed gate (after an abort, while the replica sleeps) a request waits, without
    reaching the sleeping engine, and runs once generation resumes; with ``reject_request`` it is
    answered aborted at once (verl's vLLM server's two gates)."""
    log = tmp_path / "replica.jsonl"
    monkeypatch.setenv(REPLICA_LOG_ENV, str(log))

    async def scenario():
        srv = server(model_dir)
        await srv.abort_all_requests()
        await srv.sleep()
        parked = asyncio.create_task(srv.generate("late", PROMPTS[0], {**SAMPLING, "max_tokens": 4}))
        for _ in range(20):
            await asyncio.sleep(0.005)
        assert not parked.done() and srv._parked == 1
        await srv.wake_up()
        await srv.resume_generation()
        answered = await parked
        await srv.abort_all_requests(reject_request=True)
        rejected = await srv.generate("turned-away", PROMPTS[0], {**SAMPLING, "max_tokens": 4})
        return answered, rejected

    answered, rejected = asyncio.run(scenario())
    assert answered.stop_reason == "completed" and len(answered.token_ids) >= 2
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events] == ["abort", "sleep", "wake_up", "resume_generation", "abort", "rejected"]
    assert events[3]["parked"] == 1


def test_the_replica_log_counts_aborts_and_resumes(model_dir, tmp_path, monkeypatch):
    """What the trainer tests read back from a run: each abort's count and partial lengths, and
    one ``resumed`` event per continuation."""
    log = tmp_path / "replica.jsonl"
    monkeypatch.setenv(REPLICA_LOG_ENV, str(log))
    monkeypatch.setenv(DECODE_S_ENV, "0.01")  # 20-40 tokens: >= 0.2 s, so all four are still running at the abort

    async def scenario():
        srv = server(model_dir)
        client = verl_client(srv, monkeypatch, deterministic=False)
        tasks = [asyncio.create_task(client.generate(f"g{i}", prompt_ids=PROMPTS[i % 3],
                                                     sampling_params={**SAMPLING, "max_tokens": 40}))
                 for i in range(4)]
        await asyncio.sleep(0.02)
        report = await weight_sync(srv, dict(srv.model.state_dict()), version=1)
        await asyncio.gather(*tasks)
        return report

    report = asyncio.run(scenario())
    events = [json.loads(line) for line in log.read_text().splitlines()]
    aborts = [e for e in events if e["event"] == "abort"]
    assert len(aborts) == 1 and aborts[0]["aborted"] == report["aborted_count"] == 4
    assert len(aborts[0]["partial_tokens"]) == 4
    resumed = [e for e in events if e["event"] == "resumed"]
    assert len(resumed) == 4 and all(e["global_steps"] == 1 for e in resumed)
