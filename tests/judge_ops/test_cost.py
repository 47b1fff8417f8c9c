"""Cost accounting and the judge budget (verl_async_rm/cost.py, engine/spend.py).

- cost figures equal the sum of the usage the loopback judge reported, exactly, through the real
  openai client (agent metrics, per-sample extra info, the verdict log, the strategies' metrics);
- the budget rule on the pure ledger (Hypothesis): the charged total never passes the budget, and a
  request is refused only when it could cross it;
- under many concurrent requests the agent stops before the budget is crossed, loudly, with every
  refused sample a ``budget`` failure and none scored by the failure policy.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from fractions import Fraction
from types import SimpleNamespace

import openai
import pytest
from hypothesis import given, settings, strategies as st

from verl_async_rm.agent import AsyncRewardAgent, RewardAgent
from verl_async_rm.config import AgentConfig
from verl_async_rm.cost import CostLedger, Prices, Usage, chunk_usage, usage_from, usage_metrics, with_usage
from verl_async_rm.errors import BudgetExceeded
from verl_async_rm.user_rewards.llm_judge import JudgeReward
from verl_async_rm.verdict_log import read_log
from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig



def known_usage(messages: list[dict], reply: str) -> tuple[int, int]:
    """Per-request usage the test knows nothing about in advance: large, varied, from the request."""
    digest = hashlib.sha256(repr(messages).encode()).digest()
    return 1_000 + int.from_bytes(digest[:3], "big"), 1 + digest[3]


# -- usage reporting --------------------------------------------------------------------------------
@pytest.mark.quick
def test_usage_is_read_from_every_openai_shape_and_rejected_when_unusable():
    completion_usage = openai.types.CompletionUsage(prompt_tokens=11, completion_tokens=3, total_tokens=14)
    assert usage_from(completion_usage) == Usage(11, 3)
    completion = openai.types.chat.ChatCompletion(
        id="x", object="chat.completion", created=0, model="m", choices=[], usage=completion_usage,
    )
    assert usage_from(completion) == Usage(11, 3)
    assert usage_from({"input_tokens": 5, "output_tokens": 2}) == Usage(5, 2)  # Responses API names
    assert usage_from({"prompt_tokens": 7}) == Usage(7, 0)
    assert with_usage(0.5, completion, judge_reply="1") == {"score": 0.5, "usage": completion, "judge_reply": "1"}
    for bad in ({"prompt_tokens": -1}, {"prompt_tokens": 1.5}, {"tokens": 3}, "many", {"prompt_tokens": True}):
        with pytest.raises(ValueError):
            usage_from(bad)


@pytest.mark.quick
def test_unusable_usage_fails_the_sample_as_invalid_and_is_never_scored():
    def reward(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 1.0, "usage": {"prompt_tokens": "lots"}}

    with RewardAgent(reward, {"failure_policy": "fill", "fill_value": -1.0, "max_failure_rate": 1.0}) as agent:
        chunk = agent.get(agent.submit([{"solution_str": "a"}]))
        assert chunk.scores == [-1.0] and chunk.extra_info["reward_failure"] == ["invalid"]
        assert "usage" in chunk.extra_info["reward_error"][0]


# -- the done-when test: cost equals the sum of reported usage, exactly -------------------------------
@pytest.mark.local
def test_cost_equals_the_sum_of_the_usage_the_judge_reported_exactly(tmp_path):
    prices = {"price_input_per_million": 0.15, "price_output_per_million": 0.6}
    log = tmp_path / "verdicts.jsonl"
    items = [{"solution_str": f"the answer is {i % 7}", "ground_truth": str(i % 3), "uid": i // 4} for i in range(160)]
    with JudgeServer(JudgeServerConfig(latency=(0.0, 0.01), usage=known_usage)) as server:
        reward = JudgeReward(base_url=server.base_url, api_key="k", model="judge-stub")
        with RewardAgent(reward, {"max_concurrency": 32, "verdict_log": str(log), **prices}) as agent:
            chunk = agent.get(agent.submit(items, group_size=4))
            metrics = agent.metrics()
        served = server.stats()
    assert served.outcomes["ok"] == len(items) and served.prompt_tokens_served > 160_000
    assert (metrics["input_tokens"], metrics["output_tokens"]) == (served.prompt_tokens_served, served.completion_tokens_served)
    expected_cost = float((served.prompt_tokens_served * Fraction("0.15") + served.completion_tokens_served * Fraction("0.6"))
                          / 1_000_000)
    assert metrics["cost"] == expected_cost
    assert metrics["usage_reported_requests"] == len(items) and metrics["estimated_cost"] == 0
    # Per sample: what each sample's extra info says sums to the same.
    assert chunk_usage(chunk.extra_info) == Usage(served.prompt_tokens_served, served.completion_tokens_served)
    # The verdict log: one record per sample, the same totals.
    records = read_log(log).records
    assert len(records) == len(items)
    assert sum(r["input_tokens"] for r in records) == served.prompt_tokens_served
    assert sum(r["output_tokens"] for r in records) == served.completion_tokens_served
    # The strategies' per-step metrics (verl's logger) from the same columns.
    step = usage_metrics(chunk_usage(chunk.extra_info), chunk_usage(chunk.extra_info), Prices.of(0.15, 0.6))
    assert step["async_reward/judge_input_tokens"] == served.prompt_tokens_served
    assert step["async_reward/judge_cost"] == expected_cost


# -- the budget rule, pure ----------------------------------------------------------------------------
reservations = st.builds(Usage, st.integers(0, 400), st.integers(0, 200))


@pytest.mark.quick
@settings(max_examples=300, deadline=None)
@given(
    token_budget=st.one_of(st.none(), st.integers(1, 3_000)),
    money_budget=st.one_of(st.none(), st.sampled_from([0.0005, 0.001, 0.003])),
    ops=st.lists(st.tuples(st.sampled_from(["admit", "end"]), reservations, st.floats(0, 1), st.integers(0, 2)), max_size=80),
)
def test_the_ledger_never_charges_past_the_budget_and_refuses_only_what_could_cross_it(token_budget, money_budget, ops):
    prices = Prices.of(0.5, 2.0)
    ledger = CostLedger(prices, token_budget, money_budget)
    in_flight: list[Usage] = []

    def within(usage: Usage) -> bool:
        return (token_budget is None or usage.total <= token_budget) and (
            money_budget is None or prices.cost(usage) <= Fraction(str(money_budget)))

    for op, usage, share, how in ops:
        if op == "admit":
            could_fit = within(ledger.charged + ledger.reserved + usage)
            answer = ledger.admit(usage)
            assert (answer is True) == could_fit
            if answer is True:
                in_flight.append(usage)
            else:
                assert answer is (False if in_flight else None)
        elif in_flight:
            reservation = in_flight.pop(0)
            used = Usage(int(reservation.input_tokens * share), int(reservation.output_tokens * share))
            ledger.release(reservation, [used, None, used][how], charge=how != 2)
        assert within(ledger.charged) and within(ledger.charged + ledger.reserved)
        assert ledger.in_flight == len(in_flight)


@pytest.mark.quick
def test_budget_settings_are_checked_with_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="money_budget needs price"):
        AgentConfig.from_mapping({"money_budget": 5.0})
    with pytest.raises(ValueError, match="token_budget"):
        AgentConfig.from_mapping({"token_budget": 0})
    with pytest.raises(ValueError, match="price_input_per_million"):
        AgentConfig.from_mapping({"price_input_per_million": -1})
    with pytest.raises(ValueError, match="is a directory"):
        AgentConfig.from_mapping({"verdict_log": str(tmp_path)})
    with pytest.raises(ValueError, match="does not exist"):
        AgentConfig.from_mapping({"verdict_log": str(tmp_path / "missing" / "v.jsonl")})
    assert AgentConfig.from_mapping({"money_budget": 5.0, "price_output_per_million": 1.0}).budgeted


# -- the budget under concurrency ---------------------------------------------------------------------
ESTIMATE, RESERVED_OUTPUT = 100, 50


@pytest.mark.quick
def test_many_concurrent_requests_stop_before_the_budget_is_crossed():
    asyncio.run(asyncio.wait_for(_many_concurrent_requests(), 120))


async def _many_concurrent_requests():
    reported = Usage()
    calls = 0

    async def reward(data_source, solution_str, ground_truth, extra_info=None):
        nonlocal reported, calls
        calls += 1
        await asyncio.sleep(random.uniform(0, 0.004))
        usage = Usage(random.randint(1, ESTIMATE), random.randint(0, RESERVED_OUTPUT))  # within its reservation
        reported += usage
        return {"score": 1.0, "usage": {"prompt_tokens": usage.input_tokens, "completion_tokens": usage.output_tokens}}

    budget = 20_000
    config = {"max_concurrency": 64, "token_budget": budget, "reserve_output_tokens": RESERVED_OUTPUT,
              "failure_policy": "fill", "max_failure_rate": 1.0}
    async with AsyncRewardAgent(reward, config, token_estimator=lambda item: ESTIMATE) as agent:
        ticket = agent.submit([{"solution_str": str(i), "uid": i // 8} for i in range(2_000)], group_size=8)
        with pytest.raises(BudgetExceeded, match="token_budget 20000") as raised:
            await agent.get_all(ticket, timeout=60)
        metrics = agent.metrics()
        with pytest.raises(BudgetExceeded):  # stays stopped: nothing more is sent
            agent.submit([{"solution_str": "more"}])
    charged = metrics["input_tokens"] + metrics["output_tokens"]
    assert (metrics["input_tokens"], metrics["output_tokens"]) == (reported.input_tokens, reported.output_tokens)
    assert charged <= budget
    # Stopped only when the next reservation could not fit with nothing in flight, not earlier.
    assert charged + ESTIMATE + RESERVED_OUTPUT > budget
    assert metrics["peak_in_flight"] > 8  # it really ran concurrently
    refused = metrics["failures_by_kind"]["budget"]
    assert calls == metrics["completed"] and refused == 2_000 - calls and refused > 0
    assert metrics["cancelled"] == 0 and f"{refused} samples refused" in str(raised.value)


@pytest.mark.quick
def test_a_reward_that_reports_nothing_is_charged_its_reservation_and_the_budget_still_holds():
    calls = 0

    def reward(data_source, solution_str, ground_truth, extra_info=None):
        nonlocal calls
        calls += 1
        return 1.0

    config = {"token_budget": 1_000, "reserve_output_tokens": 150, "max_concurrency": 8}
    with RewardAgent(reward, config, token_estimator=lambda item: 50) as agent:
        with pytest.raises(BudgetExceeded):
            agent.get(agent.submit([{"solution_str": str(i)} for i in range(20)]))
        metrics = agent.metrics()
    assert calls == 5 and metrics["usage_estimated_requests"] == 5  # 5 x (50 + 150) = 1,000
    assert metrics["estimated_input_tokens"] + metrics["estimated_output_tokens"] == 1_000
    assert metrics["input_tokens"] == 0 and metrics["failures_by_kind"] == {"budget": 15}


@pytest.mark.local
def test_the_strategies_log_each_steps_usage_and_the_running_total(tmp_path):
    """What the trainer strategies hand verl's logger (``StepScheduler.reward_metrics``)."""
    from omegaconf import OmegaConf

    from verl_async_rm.integration.settings import settings_from_verl_config
    from verl_async_rm.strategies.rewards import BatchRewards
    from verl_async_rm.strategies.scheduler import StepScheduler

    reward = tmp_path / "judge.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    n = int(solution_str)\n"
        "    return {'score': 1.0, 'usage': {'prompt_tokens': 100 + n, 'completion_tokens': n % 7}}\n"
    )
    config = OmegaConf.create({
        "reward": {"custom_reward_function": {"path": str(reward), "name": "compute_score"},
                   "async_agent": {"price_input_per_million": 3.0, "price_output_per_million": 15.0}},
        "actor_rollout_ref": {"rollout": {"n": 4}},
    })
    rewards = BatchRewards(settings_from_verl_config(config), tokenizer=None)
    try:
        steps = []
        for start in (0, 32):
            requests = [{"index": i, "solution_str": str(start + i), "ground_truth": None, "data_source": "t",
                         "extra_info": None, "uid": i // 4} for i in range(32)]
            pending = rewards.submit(requests)
            rewards.take(pending, 8)  # a mini-batch, then the rest: both counted
            rewards.take(pending)
            scheduler = SimpleNamespace(rewards=rewards, plan=SimpleNamespace(samples_per_mini_batch=8))
            steps.append(StepScheduler.reward_metrics(scheduler, SimpleNamespace(rewards=pending, weights_step=0), 1))
    finally:
        rewards.client.close()
    first_in, first_out = sum(100 + n for n in range(32)), sum(n % 7 for n in range(32))
    all_in, all_out = sum(100 + n for n in range(64)), sum(n % 7 for n in range(64))
    assert steps[0]["async_reward/judge_input_tokens"] == first_in and steps[0]["async_reward/judge_output_tokens"] == first_out
    assert steps[1]["async_reward/judge_input_tokens"] == all_in - first_in
    assert steps[1]["async_reward/judge_input_tokens_total"] == all_in
    assert steps[1]["async_reward/judge_cost_total"] == float(Fraction(3 * all_in + 15 * all_out, 1_000_000))


# -- the reservation covers the prompt the reward builds (issue 45 item 5) ---------------------------------
class PromptBytesJudge:
    """A stand-in for the OpenAI client behind ``JudgeReward``: answers after a moment and reports the
    worst usage a byte-level tokenizer can give the prompt it was sent (one token per UTF-8 byte, plus
    OpenAI's 3 per message and 3 to prime the reply), and a short reply within ``max_output``."""

    def __init__(self, rng: random.Random, max_output: int):
        self.rng, self.max_output, self.charged = rng, max_output, 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(self, model, messages):
        await asyncio.sleep(self.rng.uniform(0, 0.002))
        prompt = sum(len(m["content"].encode()) + 3 for m in messages) + 3
        completion = self.rng.randint(1, self.max_output)
        self.charged += prompt + completion
        usage = SimpleNamespace(prompt_tokens=prompt, completion_tokens=completion)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="1"))], usage=usage)

    async def close(self):
        pass


@pytest.mark.quick
@pytest.mark.parametrize("seed", range(3))
def test_a_budget_holds_under_2000_concurrent_requests_with_the_judges_own_estimate(seed):
    """The shipped ``JudgeReward`` reserves its whole prompt (system prompt, tags, response, reference),
    not ~4 characters a token of the response: 2,000 requests all at once (max_concurrency 2,000) never
    charge past a 60,000-token budget. (Before: the default estimate left the prompt out, ~2,000
    requests were admitted at once, and 3x the budget was charged.)"""
    rng = random.Random(seed)
    judge = JudgeReward(base_url="http://127.0.0.1:9/v1", api_key="k", model="m")
    judge.client = PromptBytesJudge(rng, max_output=8)
    budget, reserve_output = 60_000, 8
    config = {"max_concurrency": 2_000, "token_budget": budget, "reserve_output_tokens": reserve_output,
              "failure_policy": "fill", "max_failure_rate": 1.0}
    answers = ["so the answer is 42", "答案是 42 — 四十二", "x" * rng.randint(0, 400), ""]
    items = [{"solution_str": rng.choice(answers) + str(i), "ground_truth": rng.choice(["42", "四十二"]), "uid": i}
             for i in range(2_000)]

    async def run():
        returned = []
        async with AsyncRewardAgent(judge, config) as agent:
            ticket = agent.submit(items)
            with pytest.raises(BudgetExceeded):
                while chunk := await agent.get(ticket, 1, timeout=60):
                    returned.extend(chunk.indices)
            return agent.metrics(), returned

    metrics, returned = asyncio.run(run())
    charged = metrics["input_tokens"] + metrics["output_tokens"]
    assert charged == judge.client.charged  # what the judge reported is what was charged
    assert charged <= budget, f"{charged} tokens charged against a {budget}-token budget"
    assert metrics["budget_overruns"] == 0 and metrics["completed"] > 0
    # Nothing lost: every judged sample is handed out (its group hook, JudgeReward's post_process_scores,
    # may still run when the budget stops), every other one is refused as a budget failure.
    assert sorted(returned) == list(range(metrics["completed"]))
    assert metrics["failures_by_kind"]["budget"] == 2_000 - metrics["completed"]


@pytest.mark.quick
def test_a_budget_without_an_estimate_of_what_the_reward_sends_is_refused_at_start(tmp_path, capsys):
    from verl_async_rm.cli import main

    def plain(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    with pytest.raises(ValueError, match=r"token_budget/money_budget: .*estimate_input_tokens.*token_estimator=") as info:
        RewardAgent(plain, {"token_budget": 60_000})
    assert "plain" in str(info.value)
    with pytest.raises(ValueError, match="estimate_input_tokens"):
        RewardAgent(plain, {"money_budget": 1.0, "price_input_per_million": 1.0})
    with RewardAgent(plain, {"token_budget": 60_000}, token_estimator=lambda item: 10):
        pass  # the caller's estimate is a usable one
    with RewardAgent(plain, {"tokens_per_minute": 60_000}):
        pass  # rate limits alone keep the default (an estimate, not a bound)

    # On the command line: exit 2 with the message, before any request.
    reward_file = tmp_path / "plain.py"
    reward_file.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           "    raise AssertionError('called')\n")
    (tmp_path / "in.jsonl").write_text('{"solution_str": "a", "ground_truth": "a"}\n')
    code = main(["score", "--input", str(tmp_path / "in.jsonl"), "--reward-file", str(reward_file),
                 "--reward-name", "compute_score", "--no-verdict-log", "--set", "token_budget=1000"])
    assert code == 2 and "estimate_input_tokens" in capsys.readouterr().err

    # The shipped judges estimate their whole prompt: the class, the function, the group judge.
    from verl_async_rm.engine.group_judge import GroupRequest
    from verl_async_rm.engine.spend import budget_estimator
    from verl_async_rm.items import RewardItem
    from verl_async_rm.loader import wrap_reward
    from verl_async_rm.user_rewards import llm_judge
    from verl_async_rm.user_rewards.group_judge import GroupJudgeReward, build_group_messages

    config = AgentConfig(token_budget=10)
    item = RewardItem(0, "so the answer is 7", "7")
    whole_prompt = llm_judge.prompt_token_bound(llm_judge.build_messages("so the answer is 7", "7"))
    judge = wrap_reward(llm_judge.JudgeReward, {"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert budget_estimator(judge, None, config)(item) == whole_prompt
    assert budget_estimator(wrap_reward(llm_judge.compute_score), None, config)(item) == whole_prompt
    assert whole_prompt > len(llm_judge.SYSTEM_PROMPT)  # the system prompt is in it
    group = [RewardItem(i, f"candidate {i}", "7") for i in range(4)]
    group_judge = wrap_reward(GroupJudgeReward, {"base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert budget_estimator(group_judge, None, config)(GroupRequest(("uid", 0), group)) == \
        llm_judge.prompt_token_bound(build_group_messages(group))

