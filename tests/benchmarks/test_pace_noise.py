"""bench/pace_noise.py's arithmetic: the CPU a run's processes spent (ended processes included), and
the spread of identical runs as a share of a wait."""

from __future__ import annotations

import os

import pytest

from bench.pace_noise import cpu_spent, summarise, tree_cpu

pytestmark = pytest.mark.quick



def test_cpu_spent_counts_each_process_from_its_value_before_to_its_last_sample():
    before = {1: 10.0, 2: 5.0}
    samples = [{1: 11.0, 2: 6.0}, {1: 12.5, 3: 0.5}, {1: 13.0, 3: 2.0}]  # 2 ended after the first sample; 3 is new
    assert cpu_spent(before, samples) == pytest.approx(3.0 + 1.0 + 2.0)


def test_cpu_spent_of_no_samples_is_zero():
    assert cpu_spent({1: 4.0}, []) == 0.0


def test_tree_cpu_reads_this_process_and_nothing_for_a_pid_that_is_gone():
    mine = tree_cpu(os.getpid())
    assert os.getpid() in mine and mine[os.getpid()] > 0
    assert tree_cpu(2**22 + 12345) == {}


def test_summarise_gives_the_spread_and_its_share_of_the_wait():
    repeats = [{"loop_time_s": 10.0, "cpu_s": 16.0}, {"loop_time_s": 13.0, "cpu_s": 20.0},
               {"loop_time_s": 11.0, "cpu_s": 18.0}]
    summary = summarise(repeats, wait_s=6.0)
    assert summary["loop_time_s"] == {"median": 11.0, "min": 10.0, "max": 13.0, "n": 3}
    assert summary["loop_max_over_min"] == pytest.approx(1.3)
    assert summary["cpu_max_over_min"] == pytest.approx(1.25)
    assert summary["hidden_fraction_range_from_noise"] == pytest.approx(0.5)
    assert "hidden_fraction_range_from_noise" not in summarise(repeats, wait_s=None)
