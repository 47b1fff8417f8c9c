"""Reward functions and classes used by the loader and agent tests (loaded by file path)."""

import asyncio


def plain(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str == ground_truth) + bonus


async def async_plain(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0)
    return {"score": float(solution_str == ground_truth), "judge": "async"}


def recipe_tuple(data_source, solution_str, ground_truth, extra_info=None):
    return 0.5, solution_str, "explained"


class Stateful:
    def __init__(self, offset=0.0):
        self.offset = offset
        self.calls = 0
        self.groups = []

    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        self.calls += 1
        return float(solution_str == ground_truth) + self.offset

    def post_process_scores(self, scores):
        self.groups.append(list(scores))
        return [s * 10 for s in scores]


class AsyncStateful:
    async def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    async def post_process_scores(self, scores):
        return [s + 1 for s in scores]


class NoComputeScore:
    def score(self, solution_str):
        return 1.0


def wrong_signature(text):
    return 1.0


NOT_CALLABLE = 3


class Checked:
    """Validates its configuration in the constructor; records every build and close."""

    built = 0
    closed = 0

    def __init__(self, model=None, threshold=0.5):
        if model is None:
            raise ValueError("Checked needs a model")
        Checked.built += 1
        self.model = model

    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None):
        return 1.0

    async def aclose(self):
        Checked.closed += 1


def fails_on_odd(data_source, solution_str, ground_truth, extra_info=None):
    """Fails (a non-retried bug) on odd-numbered responses; a service broken for half its inputs."""
    if int(solution_str) % 2:
        raise ValueError(f"cannot judge response {solution_str}")
    return 1.0


def fails_on_tenth(data_source, solution_str, ground_truth, extra_info=None):
    """Fails on every tenth response: the occasional failure the policy handles."""
    if int(solution_str) % 10 == 9:
        raise ValueError(f"cannot judge response {solution_str}")
    return 1.0
