"""Harness for the adversarial tests (tests/agent/test_core_attacks.py, tests/agent/test_rate_limited_judge.py):
turn hangs into failures, close agents without hanging, keep other threads from crashing pytest."""

from __future__ import annotations

import logging
import threading
from typing import Callable

import looptime
import pytest

from verl_async_rm import RewardAgent


def bounded(fn: Callable, seconds: float, what: str):
    """``fn()`` in a daemon thread: its result, its exception, or an AssertionError naming ``what``
    if it has not returned within ``seconds`` (the thread is left behind, never joined)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"bounded: {what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"{what} did not return within {seconds}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def close_quietly(agent: RewardAgent, seconds: float = 20.0) -> None:
    """Teardown: close without letting a broken close() hang or fail the suite."""
    try:
        bounded(agent.close, seconds, "agent.close() in teardown")
    except BaseException:  # noqa: BLE001 - the tests that are about close() assert on it themselves
        pass


@pytest.fixture
def agents():
    """``make(reward, config, **kwargs)`` -> a RewardAgent, closed (bounded) at teardown."""
    made: list[RewardAgent] = []

    def make(reward, config=None, **kwargs) -> RewardAgent:
        agent = RewardAgent(reward, config, **kwargs)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        close_quietly(agent)


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)  # never formatted: see unformatted_logs


@pytest.fixture(autouse=True)
def unformatted_logs():
    """The records of the ``asyncio`` and ``verl_async_rm`` loggers during the test, kept but never
    formatted (nor passed on to pytest's or the root logger's handlers).

    Why: formatting a traceback on Python 3.11 parses source with ``ast`` (for the ``^^^`` markers),
    and ``ast.parse`` there keeps its recursion depth per interpreter, not per thread (CPython
    gh-106905, pytest-dev/pytest#10763). An agent whose loop thread logs thousands of "Task exception
    was never retrieved" tracebacks while pytest renders a failure in the main thread crashes the
    whole session with INTERNALERROR "AST constructor recursion depth mismatch". Tests read
    ``unformatted_logs.records`` instead of ``caplog``."""
    collector = _Collector()
    saved = []
    for name in ("asyncio", "verl_async_rm"):
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate))
        logger.addHandler(collector)
        logger.propagate = False
    try:
        yield collector
    finally:
        for logger, propagate in saved:
            logger.removeHandler(collector)
            logger.propagate = propagate


def virtual(scenario):
    """Run ``scenario()`` (a coroutine function) on a fresh virtual-time loop."""
    loop = looptime.new_event_loop()
    try:
        return loop.run_until_complete(scenario())
    finally:
        loop.close()


def prepared(config):
    """``main_ppo.prepare`` completes a config in place and returns the run's settings: the config."""
    from verl_async_rm.main_ppo import prepare

    prepare(config)
    return config
