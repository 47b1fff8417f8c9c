"""The trainer runs of ``async_agent`` on verl's own v1 trainer modes through verl's STOCK entry point
(``python -m verl.trainer.main_ppo``, on the CPU backend; issue 43 item 2, issue 45 item 16), shared
by tests/seam/test_verl_async_modes.py and tests/seam/test_legacy_training.py (one session fixture,
``verl_modes_runs``, in tests/seam/conftest.py): four runs, two at a time, each with its own
loopback judge, and a fifth in the same queue, the group judge's training run.

- ``sync`` (2 steps, validation first): verl trains a group without its failed session. Spelled the
  legacy way (issue 44 item 5: one run proves both): verl's legacy selector
  ``reward_model.reward_manager=async_agent`` and the legacy top-level ``custom_reward_function``
  block (the probe reward, its kwargs), while ``reward.custom_reward_function`` names the toy reward
  (so a probe call proves the legacy block was moved, and won);
- ``colocate_async`` (2 steps, verl's 2 s-poll sampler): verl evicts a group with a failed session
  and replaces it with a fresh prompt (from step 1 on: every even prompt loses a session); the current
  spelling (``reward.reward_manager.name``);
- ``off_policy`` (3 steps): this package's entry point (``python -m verl_async_rm.main_ppo``) with the
  recipe's ``off_policy_steps=1`` alone, which runs as verl's ``colocate_async`` with the agent: it
  must train as the stock ``colocate_async`` run does (every test of the module runs on it);
- ``budget`` (``colocate_async``, at most 4 steps): a token budget spent mid-run; started once one
  of the other two has ended;
- ``group_judge`` (v0, 4 steps, this package's entry point with the mini-batch pipeline and one step
  off-policy): the example ``GroupJudgeReward`` through the real ``openai`` client, one chat call per
  GRPO group, against a loopback judge that ranks the toy task's candidates
  (tests/seam/test_group_judge_training.py; in this queue so that it trains beside another run, not
  alone).

Half the prompts lose one of their four sessions (``tests/helpers/session_probe.py``), about one
reward in ten raises (``neutral``: the group's mean), and every reward asks the loopback judge first
(real HTTP, three of verl's reward-loop workers; the agent's cap 2 and 600 requests a minute). Every
score names its sample (``identity``). ``group_wait`` and ``group_timeout`` are an hour and each
run's timeout 15 minutes: a group that waited for a session verl knows has failed would hold its step
past the run's end (the 634 s step of issue 45)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT
from tests.helpers import session_probe
from tests.helpers.rollout_dump import dump_rows
from tests.helpers.trainer_queue import QueuedRun, run_queue

CAP, RPM, N, PROMPTS = 2, 600, 4, 8
RUNS = {"sync": 2, "colocate_async": 2, "off_policy": 3}  # mode -> steps
# off_policy: this package's entry point with the recipe's flag alone, which runs as verl's colocate_async
# with the agent (strategies/plan.py, off_policy_on_verl): it must train as the stock colocate_async run does
OFF_POLICY = "off_policy"
BUDGET_STEPS, BUDGET_TOKENS = 4, 4000
WAIT = 3600  # s: a group closed by its timer would outlast the run's timeout
LEGACY = "sync"  # the run spelled the legacy way
GROUP_JUDGE, GROUP_JUDGE_STEPS, GROUP_JUDGE_PROMPTS = "group_judge", 4, 8


def hydra_value(value) -> str:
    from verl_async_rm_rig.cpu_backend.launch import _hydra_value

    return _hydra_value(value)


def run_config(out: Path, assets, loops: str, data: str, base_url: str, mode: str, legacy: bool = False):
    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig

    kwargs = {"call_log": str(out / "calls.jsonl"), "hook_log": str(out / "hooks.jsonl"), "base_url": base_url}
    reward = {"reward_path": str(Path(session_probe.__file__)), "reward_name": "ProbeJudge", "reward_kwargs": kwargs,
              "reward_manager": "async_agent"}
    legacy_overrides = []
    if legacy:  # the toy reward under reward.*, verl's manager unnamed there: the legacy keys must win
        reward = {}
        legacy_overrides = ["reward_model.reward_manager=async_agent",  # verl's legacy selector, string form
                            f"custom_reward_function.path={Path(session_probe.__file__)}",  # verl's legacy top-level block
                            "custom_reward_function.name=ProbeJudge",
                            f"+custom_reward_function.reward_kwargs={hydra_value(kwargs)}"]
    mode_overrides = ["off_policy_steps=1"] if mode == OFF_POLICY else [f"trainer.v1.trainer_mode={mode}"]
    entry = {"entry_module": "verl_async_rm.main_ppo"} if mode == OFF_POLICY else {}
    return CPURunConfig(
        **entry,
        out_dir=str(out), trainer="v1", steps=RUNS[mode], model_dir=assets.model_dir, train_file=data,
        val_file=assets.val_file, val_before_train=mode == "sync", **reward,
        timeout_s=900, extra_env={"PYTHONPATH": str(ROOT)},  # Ray workers import the probe loop
        v1_poll_interval_s=0.05 if mode == "sync" else None,  # the rig's fast sampler is verl's sync one
        extra_overrides=[
            *legacy_overrides,
            *mode_overrides,
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}",
            "reward.num_workers=3",
            f"+reward.async_agent.max_concurrency={CAP}",
            f"+reward.async_agent.requests_per_minute={RPM}",
            "+reward.async_agent.max_attempts=6",  # injected 500s: retried until the judge answers
            f"+reward.async_agent.group_wait={WAIT}",
            f"+reward.async_agent.group_timeout={WAIT}",
            f"+reward.async_agent.verdict_log={out / 'verdicts.jsonl'}",
            f"trainer.rollout_data_dir={out / 'rollouts'}",
        ],
    )


def budget_config(out: Path, assets, loops: str, data: str, base_url: str):
    cfg = run_config(out, assets, loops, data, base_url, "colocate_async")
    cfg.steps = BUDGET_STEPS
    cfg.extra_overrides += [f"+reward.async_agent.token_budget={BUDGET_TOKENS}", "+reward.async_agent.reserve_output_tokens=8"]
    return cfg


def toy_ranking_judge(messages: list[dict]) -> str:
    """The loopback judge of the group-judge run: the toy task's score of every candidate, in order (the
    candidate block adds one newline each side)."""
    from verl_async_rm_rig.cpu_backend.toy_task import score_text
    from verl_async_rm_rig.judge_server import group_prompt

    reference, candidates = group_prompt(messages)
    return " ".join(repr(score_text(c[1:-1], reference.strip())) for c in candidates)


def group_judge_config(out: Path, assets, base_url: str):
    """v0 with the strategies on (mini-batch pipeline, one step off-policy), the example group judge."""
    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig

    return CPURunConfig(
        out_dir=str(out), trainer="v0", steps=GROUP_JUDGE_STEPS, entry_module="verl_async_rm.main_ppo",
        model_dir=assets.model_dir, train_file=assets.train_file, val_file=assets.val_file,
        reward_manager="async_agent", val_before_train=False,
        reward_path="pkg://verl_async_rm.user_rewards.group_judge", reward_name="GroupJudgeReward",
        reward_kwargs={"base_url": base_url, "model": "judge-stub"}, timeout_s=600,
        extra_overrides=["mini_batch_pipeline=true", "off_policy_steps=1",
                         "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # 4 mini-batches per step
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                         f"trainer.rollout_data_dir={out / 'rollouts'}"],
    )


def run_all(tmp_path_factory) -> dict:
    """Every run, two at a time, each with its own judge: name -> (out_dir, RunResult, the judge's stats)."""
    from verl_async_rm_rig.cpu_backend.launch import CPURunConfig, prepare_assets, start
    from verl_async_rm_rig.judge_server import JudgeServer, JudgeServerConfig

    assets = prepare_assets(CPURunConfig(out_dir=str(tmp_path_factory.mktemp("assets"))))
    data_dir = Path(assets.out_dir) / "data"
    loops = session_probe.write_config(str(data_dir / "loops.yaml"))
    data = session_probe.write_dataset(assets.train_file, str(data_dir / "probe.parquet"))
    names = [*RUNS, "budget", GROUP_JUDGE]
    judges = {"budget": JudgeServerConfig(latency=(0.05, 0.15)),
              GROUP_JUDGE: JudgeServerConfig(judge=toy_ranking_judge, latency=(0.01, 0.05), rate_500=0.05)}
    servers = {name: JudgeServer(judges.get(name) or JudgeServerConfig(latency=(0.05, 0.15), rate_500=0.05, seed=i)).start()
               for i, name in enumerate(names)}
    outs = {name: tmp_path_factory.mktemp(name) for name in names}

    def config(name):
        if name == "budget":
            return budget_config(outs[name], assets, loops, data, servers[name].base_url)
        if name == GROUP_JUDGE:
            return group_judge_config(outs[name], assets, servers[name].base_url)
        return run_config(outs[name], assets, loops, data, servers[name].base_url, name, legacy=name == LEGACY)

    try:
        results = run_queue({name: QueuedRun(lambda name=name: config(name)) for name in names},
                            lambda cfg: start(cfg, progress=False))
    finally:
        stats = {name: server.stats() for name, server in servers.items()}
        for server in servers.values():
            server.close()
    return {name: (outs[name], results[name], stats[name]) for name in names}


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def training_calls(out: Path) -> list[dict]:
    """The reward's calls for training samples (the sync run also validates, before step 1)."""
    return [call for call in read_jsonl(out / "calls.jsonl") if not call["probe"].startswith(session_probe.VALIDATION)]


def trained(out: Path) -> dict[int, list[dict]]:
    """verl's rollout dump per step, without its synthetic padding rows."""
    return {int(p.stem): [r for r in dump_rows(p) if not r["uid"].startswith("pad")]
            for p in sorted((out / "rollouts").glob("*.jsonl"))}
