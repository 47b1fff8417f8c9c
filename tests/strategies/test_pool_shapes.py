"""The staleness pool on every batch shape verl's v1 trainer trains on (issue 43): groups of several
sizes in one batch (per-prompt ``__rollout_n__``), groups a failed agent-loop session left short,
prompts every session of which failed (verl keeps no row of them), several outputs per session (a
multi-output loop: one request scores them all). The pool driver (strategies/pool_driver.py) and the
reward tickets (strategies/rewards.py) run against an agent made of the engine's own ticket ledger
(engine/ledger.py, pure), whose samples are scored in an order Hypothesis chooses; waiting lets the
next sample in that order be scored. No verl, no Ray, no clock: quick.

The pool's promises hold whatever the shapes: every group trained once (all its rows, each with its
session's score) or dropped (counted, only under ``on_stale=drop``); never staler than
``max_staleness``; oldest ready first; a step trains on ``train_batch_size`` prompts whatever their
group sizes, as verl's v1 sampler counts them (a prompt without rows among them; one group with
rows more when they would all be such); a step with enough groups scored does not wait under
``on_stale=drop``, nor under ``wait`` with every group scored; a checkpoint names exactly the
prompts trained or dropped."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_async_rm.engine.ledger import GroupResult, TicketLedger, assemble_chunk
from verl_async_rm.integration.settings import settings_from_verl_config
from verl_async_rm.outcomes import Scored
from verl_async_rm.strategies.pool_driver import PoolDriver
from verl_async_rm.strategies.rewards import BatchRewards

pytestmark = pytest.mark.quick


class LedgerAgent:
    """The agent's ticket verbs over ``TicketLedger``s, scoring one sample at a time in the order
    ``choose`` picks (an index into the samples not scored yet). A wait with a timeout lets one
    sample be scored; a wait without one, as many as it takes."""

    def __init__(self, choose):
        self.choose = choose
        self.ledgers: dict[str, TicketLedger] = {}
        self.items: dict[tuple[str, int], dict] = {}
        self.unscored: list[tuple[str, int]] = []  # in the order samples reached the agent
        self.scored = 0
        self._numbers = itertools.count()

    # -- the client verbs the trainer uses --------------------------------------------------------
    def submit(self, items, group_size=1) -> str:
        ticket = self._new(TicketLedger([(item["index"], item["uid"]) for item in items], group_size))
        self._enqueue(ticket, items)
        return ticket

    def open_ticket(self, group_size=1) -> str:
        return self._new(TicketLedger([], group_size, open=True))

    def add(self, ticket, items) -> None:
        self.ledgers[ticket].add([(item["index"], item["uid"]) for item in items])
        self._enqueue(ticket, items)

    def close_ticket(self, ticket) -> None:
        ledger = self.ledgers[ticket]
        for group in ledger.close():  # a group short of its size settles with the members it has
            self._ready(ticket, group)

    def remaining(self, ticket) -> int:
        return self.ledgers[ticket].remaining_samples

    def cancel(self, ticket) -> int:
        left = [s for s in self.unscored if s[0] == ticket]
        self.unscored = [s for s in self.unscored if s[0] != ticket]
        return len(left)

    def get(self, ticket, n=None, timeout=None):
        ledger = self.ledgers[ticket]
        ledger.check_request(n)
        while True:
            groups = ledger.take(n)
            if groups is not None:
                return assemble_chunk(groups)
            if timeout == 0:
                raise TimeoutError(ticket)
            if not self.unscored:
                raise AssertionError(f"a wait on ticket {ticket} for samples that will never be scored")
            self._score_next()
            if timeout is not None:  # time passed: one sample scored, somewhere
                groups = ledger.take(n)
                if groups is None:
                    raise TimeoutError(ticket)
                return assemble_chunk(groups)

    # -- scoring ----------------------------------------------------------------------------------
    def score_some(self, count: int) -> None:
        for _ in range(min(count, len(self.unscored))):
            self._score_next()

    def _score_next(self) -> None:
        ticket, index = self.unscored.pop(self.choose(len(self.unscored)))
        self.scored += 1
        settled = self.ledgers[ticket].settle(index, Scored(float(self.items[ticket, index]["ground_truth"])))
        if settled is not None:
            self._ready(ticket, settled)

    def _ready(self, ticket, settled) -> None:
        scores = [outcome.score for outcome in settled.outcomes]
        self.ledgers[ticket].mark_ready(GroupResult(settled.key, settled.indices, scores, [{} for _ in scores],
                                                    [0.0] * len(scores)))

    def _new(self, ledger: TicketLedger) -> str:
        ticket = f"t{next(self._numbers)}"
        self.ledgers[ticket] = ledger
        return ticket

    def _enqueue(self, ticket, items) -> None:
        for item in items:
            self.items[ticket, item["index"]] = item
            self.unscored.append((ticket, item["index"]))


class FrozenClock:
    """rewards.py's clock, stopped: a wait with a timeout always has all of it left, so each such
    wait lets one sample be scored however loaded the machine is (a timeout run out on a slow
    machine would score nothing, and the same draws would make another run)."""

    @staticmethod
    def monotonic() -> float:
        return 0.0


def score_of(batch: int, group: int, session: int) -> float:
    """Every session's own score (a trained row must carry its session's)."""
    return float(batch * 10_000 + group * 100 + session)


# One prompt: its sessions (__rollout_n__), which of them failed, the outputs of each session.
PROMPT = st.tuples(st.integers(1, 4), st.sets(st.integers(0, 3), max_size=4), st.integers(1, 2))


@settings(max_examples=120, deadline=None)
@given(g=st.integers(1, 4), steps=st.integers(1, 5), lookahead=st.integers(0, 1), s=st.integers(0, 2),
       on_stale=st.sampled_from(["wait", "drop"]), stream=st.booleans(), data=st.data())
def test_every_shape_verl_trains_on_keeps_the_pools_promises(g, steps, lookahead, s, on_stale, stream, data):
    with mock.patch("verl_async_rm.strategies.rewards.time", FrozenClock):  # the draws alone decide the run
        agent = LedgerAgent(lambda n: data.draw(st.integers(0, n - 1), label="scored next"))
        config = {"reward": {"async_agent": {"extra_keys": []}}, "actor_rollout_ref": {"rollout": {"n": 4}}}
        rewards = BatchRewards(settings_from_verl_config(config), tokenizer=None, client=agent)
        driver = PoolDriver(rewards, g, s, on_stale)
        rows_of: dict = {}  # (batch, group) -> its rows, as verl keeps them (no row of a failed session)
        score: dict = {}  # row -> its session's score
        born_of: dict = {}
        made = itertools.count(1)

        def generate(born: int) -> bool:
            b = next(made)
            prompts = data.draw(st.lists(PROMPT, min_size=g, max_size=g), label=f"batch {b}")
            if all(set(range(n)) <= failed for n, failed, _ in prompts):  # no row at all: verl's sampler raises (stock too)
                prompts[0] = (prompts[0][0], set(), prompts[0][2])
            requests, rows = [], []
            for p, (sessions, failed, outputs) in enumerate(prompts):
                uid = f"b{b}p{p}"
                for session in range(sessions):
                    if session in failed:
                        continue  # the session raised: verl keeps no row of it, nothing is sent to the agent
                    requests.append({"index": p * 16 + session, "solution_str": f"{uid}-{session}", "data_source": "t",
                                     "ground_truth": score_of(b, p, session), "extra_info": {}, "uid": uid})
                    rows.append(tuple((b, p, session, o) for o in range(outputs)))
                    rows_of.setdefault((b, p), set()).update(rows[-1])
                    score.update(dict.fromkeys(rows[-1], score_of(b, p, session)))
                born_of[b, p] = born
            if stream:  # scored while generating: the step's open ticket, a size per uid
                ticket = rewards.open_stream({f"b{b}p{p}": prompt[0] for p, prompt in enumerate(prompts)})
                for request in requests:
                    agent.add(ticket.ticket, [request])
                    agent.score_some(data.draw(st.integers(0, 1), label="scored while generating"))
                pending = rewards.close_stream(ticket, {r["index"]: row for r, row in zip(requests, rows)},
                                               {r["index"]: r["uid"] for r in requests})
            else:  # submitted when generation ends: one ticket per group size
                pending = rewards.submit(requests, rows_of=rows)
            positions = {f"b{b}p{p}": p for p in range(g)}
            driver.add(SimpleNamespace(rewards=pending, weights_step=born - 1 - lookahead, loader_state=None), born, positions)
            ordinal = driver.live[-1].ordinal
            added.update((ordinal, uid) for uid in positions)
            rowless.update((ordinal, f"b{b}p{p}") for p in range(g) if (b, p) not in rows_of)
            return True

        generated_for, trained, dropped = 0, [], []
        added: set = set()  # pool keys (batch ordinal, uid) added by the last generations
        rowless: set = set()  # pool keys of prompts every session of which failed
        for step in range(1, steps + 1):
            while generated_for < min(step + lookahead, steps):
                generated_for += 1
                generate(generated_for)
            agent.score_some(data.draw(st.integers(0, 6), label="scored before the step"))
            driver.harvest_ready()  # what the step finds scored (its own harvest then finds nothing new)
            ready = {key: (group.born, group.order) for key, group in driver.pool.groups.items() if group.ready}
            unready = [key for key, group in driver.pool.groups.items() if not group.ready]
            before, keys_before, dropped_before = agent.scored, set(driver.pool.groups), driver.pool.dropped
            added.clear()
            chosen = driver.next_step(step, lambda: generate(step), last_step=steps)
            waited = agent.scored > before
            gone = (keys_before | added) - set(driver.pool.groups)  # taken or dropped this step

            groups: dict = {}
            for row in chosen.rows:
                groups.setdefault((row[0], row[1]), set()).add(row)
            # train_batch_size prompts, whatever their sizes (verl's sampler counts them alike), a prompt
            # every session of which failed among them with no rows; one group with rows more when they
            # would all be such prompts; each group whole
            empty = chosen.metrics["async_rm/pool_prompts_without_rows"]
            assert groups and (len(groups) + empty == g or (len(groups), empty) == (1, g)), (step, sorted(groups), empty)
            assert all(rows == rows_of[group] for group, rows in groups.items())
            assert len(chosen.rows) == len(set(chosen.rows)) and chosen.scored.rows == chosen.rows
            assert chosen.scored.scores == [score[row] for row in chosen.rows]  # every output: its session's score
            for row in chosen.rows:  # a session's outputs are one sample (failure_policy=mask counts samples)
                assert chosen.sample_of_row[row] == chosen.sample_of_row[row[:3] + (0,)]
            assert len({chosen.sample_of_row[row] for row in chosen.rows}) == len({row[:3] for row in chosen.rows})
            for group in groups:  # never staler than the bound; the staleness metric per row
                assert step - born_of[group] <= s
            assert {chosen.staleness_of_row[row] for row in chosen.rows} <= set(range(lookahead + s + 1))
            # oldest ready first: no group ready when the step chose, and not taken (nor dropped), is
            # older than a group taken freely (one not due: a due one is forced)
            dropped_now = {(row[0], row[1]) for row in chosen.dropped_rows}
            taken_keys = {key for key in gone if _group(key) in groups or key in rowless}
            assert len(gone - taken_keys) == len({key for key in gone if _group(key) in dropped_now})
            assert driver.pool.dropped - dropped_before == len(gone) - len(groups) - empty  # every drop counted
            extra = next(iter(groups)) if empty == g else None  # the group taken beyond the prompts without rows
            free = [ready[key] for key in taken_keys if key in ready and step - ready[key][0] < s and _group(key) != extra]
            for key in set(ready) - gone:
                assert all(ready[key] > age for age in free), (step, key)
            scored_rows = [key for key in ready if key not in rowless]
            if on_stale == "drop" and len(ready) >= g and scored_rows:
                assert not waited  # a straggler never holds a step that has enough groups scored
            if not unready and len(ready) >= g:
                assert not waited
            trained += [_group(key) for key in taken_keys]
            dropped += sorted(_group(key) for key in gone - taken_keys)
            assert all(step - born_of[group] >= s for group in dropped_now)  # only a due group is dropped

        # every prompt: trained once (a prompt without rows: taken, nothing to train), dropped (counted,
        # only under on_stale=drop), or still in the pool; none twice
        assert len(trained) == len(set(trained)) and not set(trained) & set(dropped)
        assert on_stale == "drop" or driver.pool.dropped == 0
        left = {_group(key) for key in driver.pool.groups}
        assert set(trained) | set(dropped) | left == set(born_of)
        # a batch leaves once each of its prompts is trained, dropped or had no row; what the rest
        # record for a checkpoint is exactly those prompts
        for live in driver.live:
            b = int(next(iter(live.position_of)).split("p")[0][1:])
            done = {p for p in range(g) if (b, p) in set(trained) | set(dropped)}
            assert live.finished == done


def _group(key) -> tuple[int, int]:
    """A pool key (batch ordinal, uid "b{batch}p{prompt}") as (batch, prompt)."""
    b, p = key[1][1:].split("p")
    return int(b), int(p)
