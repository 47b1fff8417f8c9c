"""JudgeReward that appends one line per group hook call to a file (visible across processes)."""

from verl_async_rm.user_rewards.llm_judge import JudgeReward


class CountingJudge(JudgeReward):
    def __init__(self, hook_log, **kwargs):
        super().__init__(**kwargs)
        self.hook_log = hook_log

    def post_process_scores(self, scores):
        with open(self.hook_log, "a") as f:
            f.write(" ".join(str(s) for s in scores) + "\n")
        return super().post_process_scores(scores)
