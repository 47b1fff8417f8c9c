"""Tail-tolerant steps with bounded staleness: which scored groups a step trains on. Pure (no verl,
no Ray, no clock of its own), so the rules are tested fast and exhaustively (tests/strategies/test_pool.py).

The pool holds the groups of every batch generated so far and not yet trained on. Each group is
*born* at the step whose batch it belongs to (batch b is generated for step b, with the weights of
step b - 1 - k under k steps of lookahead) and is *ready* once the agent scored it. At step t:

1. a group whose staleness would pass ``max_staleness`` if carried again (``t - born >=
   max_staleness``) is *due*: the step trains on it, waiting for its score (``on_stale=wait``), or
   drops it unscored (``on_stale=drop``, counted) as long as the step can still be filled without
   it (a step never trains on fewer than ``train_batch_size`` groups: otherwise it waits);
2. the rest of the step's ``train_batch_size`` groups are the oldest ready ones (birth step, then
   the order they were generated in: deterministic);
3. while fewer are ready than the step needs, the step waits for the next group to be scored, any
   group (the first to finish), and selects again; with nothing left to wait for (dropped groups
   ate the supply) the caller generates one more batch (``starved``);
4. a group still waiting is carried into a later step, its staleness growing by one per step.

Supply (``short_of_supply``): a pool fed one batch a step holds little more than the step needs,
so a step waits for "any" group whenever too few of it are scored, and under ``on_stale=drop``
each dropped group shrinks the pool for good (measured: the wait per step grew after two drops).
Before a step, while the pool holds fewer groups than this step and the lookahead's train on
(``train_batch_size`` x (1 + lookahead), fewer near the end), one batch more is generated, born at
the latest step generated for. With ``off_policy_steps: auto`` that lookahead is the auto rule's
without v1's one-batch clamp (supply batches are generated within the step), but no deeper than the
staleness bound lets the pool's groups be trained in time (``supply_lookahead``): a tail longer than
a step keeps more groups in the pool, so a step rarely waits for "any" group. The price: the groups
still in the pool when the run ends (about ``lookahead`` batches) were generated and never trained.

Deadlines (why nothing is dropped under ``on_stale=wait`` with a supply): a group born at b must
be trained by step b + ``max_staleness``, its deadline, and each step trains ``train_batch_size``.
Steps that take younger ready groups while older ones are out can leave more groups due at a later
step than it trains. Under ``drop`` the oldest are trained and the rest dropped (counted), so no
sample is ever staler than the bound. Under ``wait`` two rules keep that from happening: the supply
adds a batch only while the whole batch fits under the count above (``whole_batches``), so the pool
never holds more groups than the steps up to the newest deadline train; and a step takes younger
ready groups only while the groups left can all still meet their deadlines, counted earliest
deadline first (``first_overdue``); otherwise it waits for a score first (``for_bound``: rare, and
counted with the waits for due groups). The run's last step keeps no room for steps after it. A
refill (``starved``) happens only when drops ate the supply, so only under ``drop``; at
``max_staleness=0`` it is all due at once, and its excess is dropped (counted).

Rowless prompts: verl's v1 sampler counts prompts, whatever their group sizes (per-prompt
``__rollout_n__``, sessions that failed), and a prompt every session of which failed is one of its
``train_batch_size`` with no rows (verl's ``sync_refill_failed_groups``, which replaces it
instead, is refused at start with the pool: strategies/plan.py). The pool counts alike: such a prompt is a group, ready at once, that a step
takes like any other (oldest first, its deadline its batch's) and trains nothing of. So every batch
brings ``train_batch_size`` groups whatever failed, and the supply and deadline counts above hold
as for full batches (under ``wait`` nothing is ever dropped). One exception: a step whose groups
would all be rowless would train nothing, so it takes one group with rows more (the oldest scored;
waiting for the first to be scored if none is).

``max_staleness: auto`` (``auto_staleness_bound``): under ``wait`` a step waits for a due group
whose calls outlive the bound (a hung call holds it until the agent's ``ticket_deadline`` settles
it); under ``drop`` such a group is lost. A group carried for as many steps as the deadline lasts,
``ceil(ticket_deadline / C)`` with C the median measured step compute, is settled before it is due,
so neither happens. The bound is raised to that each step and never lowered: every group in the
pool was promised the bound in force when it was born, and a lower one could make it due at once.
The staleness a sample actually gets still follows the latency it met (a group is trained as soon
as it is scored, oldest first); only a straggler is carried up to the bound.

Staleness of a sample trained at step t: ``t - 1 - weights_step`` (the number of policy updates
between the weights that generated it and the ones it is trained against), the same measure as
``async_reward/staleness``. Carrying a group c steps adds c.

``off_policy_steps: auto`` (``auto_lookahead``): batches must be generated far enough ahead that
their rewards arrive before they are needed: k steps of compute C must cover the reward latency L,
so ``k = ceil(L / C)``, clamped to ``[min_steps, max_steps]``; L is a high quantile (p90) of the
measured per-group latency, C the measured step compute without reward waits.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Hashable, Iterable, Optional, Sequence

ON_STALE = ("wait", "drop")


@dataclass
class PooledGroup:
    key: Hashable
    born: int  # the step its batch was generated for
    order: int  # position among every group ever pooled (generation order): ties broken by it
    ready: bool = False
    rowless: bool = False  # a prompt every session of which failed: one of a step's prompts, with no rows


@dataclass(frozen=True)
class Selection:
    """One step's choice. ``take``: train on these (ready) groups; ``wait_for``: the step must wait
    for a score before choosing again (``None``: for any pending group; a key: for that due group);
    ``drop``: due groups dropped unscored (``on_stale=drop``)."""

    take: tuple = ()
    wait_for: Optional[object] = None
    waiting: bool = False
    drop: tuple = ()
    starved: bool = False  # too few groups left, none pending (drops ate the supply): generate a batch more
    for_bound: bool = False  # on_stale=wait: waiting now keeps a later step from more due groups than it trains


@dataclass
class GroupPool:
    train_groups: int  # groups per step (data.train_batch_size)
    max_staleness: int  # carries a group may take beyond its own step
    on_stale: str = "wait"
    groups: dict = field(default_factory=dict)
    _order: int = 0
    carried: int = 0  # groups that missed their own step (counted once each)
    dropped: int = 0
    _carried_keys: set = field(default_factory=set)

    def __post_init__(self):
        if self.on_stale not in ON_STALE:
            raise ValueError(f"on_stale must be one of {ON_STALE}, got {self.on_stale!r}")
        if self.max_staleness < 0 or self.train_groups < 1:
            raise ValueError("max_staleness must be >= 0 and train_batch_size >= 1")

    # -- book-keeping ---------------------------------------------------------------------------
    def add(self, keys: Iterable[Hashable], born: int, rowless: Iterable[Hashable] = ()) -> None:
        """``rowless``: those of ``keys`` that are prompts every session of which failed (ready at
        once, nothing to score: "Rowless prompts" above)."""
        rowless = set(rowless)
        for key in keys:
            if key in self.groups:
                raise ValueError(f"group {key!r} is already in the pool")
            empty = key in rowless
            self.groups[key] = PooledGroup(key, born, self._order, ready=empty, rowless=empty)
            self._order += 1

    def scored(self, key: Hashable) -> None:
        self.groups[key].ready = True

    def pending(self) -> list[Hashable]:
        return [g.key for g in self._by_age() if not g.ready]

    def _by_age(self) -> list[PooledGroup]:
        return sorted(self.groups.values(), key=lambda g: (g.born, g.order))

    # -- a step ---------------------------------------------------------------------------------
    def select(self, step: int, last_step: Optional[int] = None) -> Selection:
        """What step ``step`` trains on now, or what it must wait for first. Call again after each
        wait (``scored``); the groups taken or dropped leave the pool. ``last_step``: the run's last
        step (None: unknown); no step after it is kept room for."""
        by_age = [g for g in self._by_age() if g.born <= step]  # a batch for a later step is not due yet
        due = [g for g in by_age if step - g.born >= self.max_staleness]
        late_due = [g for g in due if not g.ready]
        others = len(self.groups) - len(late_due)  # ready due groups, and every group not due
        # Dropping is only allowed while the step can still be filled without them; otherwise the
        # step waits for them as under on_stale=wait (a step never trains on fewer groups).
        dropping = self.on_stale == "drop" and others >= self.train_groups
        drop = tuple(g.key for g in late_due) if dropping else ()
        if not dropping:
            late = next((g for g in due if not g.ready), None)
            if late is not None:
                return Selection(wait_for=late.key, waiting=True)
        for key in drop:
            del self.groups[key]
            self.dropped += 1
        ready = [g for g in self._by_age() if g.ready]  # any age: a later batch's ready group may fill in
        due_ready = [g for g in ready if g.born <= step and step - g.born >= self.max_staleness]
        rest = [g for g in ready if g not in due_ready]
        chosen = (due_ready + rest)[: self.train_groups]
        if len(due_ready) > self.train_groups:
            # more due than a step trains on (on_stale=drop: supply batches and refills; never under
            # wait, "Deadlines" above): the excess cannot be
            # carried without passing max_staleness, so it is dropped like a late due group
            excess = due_ready[self.train_groups:]
            for g in excess:
                del self.groups[g.key]
                self.dropped += 1
            drop = (*drop, *(g.key for g in excess))  # ``chosen`` is already the oldest due ones
        if len(chosen) < self.train_groups and self.pending():
            return Selection(waiting=True, drop=drop)  # wait for the next score, whichever group it is
        if len(chosen) < self.train_groups:
            return Selection(starved=True, drop=drop)
        if all(g.rowless for g in chosen):
            # prompts whose sessions all failed alone would train nothing: one group with rows more
            # ("Rowless prompts" above), the oldest scored, else the first to be scored
            extra = next((g for g in ready if not g.rowless), None)
            if extra is None:
                return Selection(waiting=True, drop=drop) if self.pending() else Selection(starved=True, drop=drop)
            chosen.append(extra)
        if self.on_stale == "wait" and self._must_wait_for_an_older_group(step, chosen, last_step):
            # taking younger ready groups now would leave more groups due at some later step than
            # the steps until then can train (wait: none may be dropped): the step waits for a
            # score first, as it would for a due group ("Deadlines" above)
            return Selection(waiting=True, for_bound=True)
        for g in chosen:
            del self.groups[g.key]
        for g in self.groups.values():  # what stays behind from this step's batch (or older) is carried
            if g.born <= step and g.key not in self._carried_keys:
                self._carried_keys.add(g.key)
                self.carried += 1
        self._carried_keys -= {g.key for g in chosen}
        return Selection(take=tuple(g.key for g in chosen), drop=drop)

    def _must_wait_for_an_older_group(self, step: int, chosen: list, last_step: Optional[int]) -> bool:
        """Whether, after this step takes ``chosen``, some later step s (up to ``last_step``) would
        hold more groups that must be trained by s (born + max_staleness <= s) than the steps
        step+1..s train, while a group due by s is still being scored (waiting for it helps: once
        it is in, it is taken instead of a younger one; with every such group in, nothing can)."""
        taken = {g.key for g in chosen}
        left = [g for g in self.groups.values() if g.key not in taken]
        s = first_overdue(step, [g.born + self.max_staleness for g in left], self.train_groups, last_step)
        return s is not None and any(not g.ready and g.born + self.max_staleness <= s for g in left)

    def raise_bound(self, max_staleness: int) -> None:
        """``max_staleness: auto``: a higher bound for every group, those in the pool included (they
        may only be carried longer); a lower one is ignored ("max_staleness: auto" above)."""
        self.max_staleness = max(self.max_staleness, int(max_staleness))

    def snapshot(self) -> dict:
        """What a checkpoint must record to resume without losing or repeating a group."""
        return {"groups": [(g.key, g.born, g.order) for g in self._by_age()], "carried": self.carried,
                "dropped": self.dropped, "order": self._order}


def first_overdue(step: int, deadlines: list[int], train_groups: int, last_step: Optional[int] = None) -> Optional[int]:
    """The first step s in (step, last_step] by which groups with these deadlines (the last step
    each may be trained in) cannot all be trained, the steps after ``step`` each training
    ``train_groups``: more deadlines <= s than (s - step) x train_groups (earliest deadline first is
    optimal for unit jobs, so that count is the whole test); None when they all can."""
    for count, d in enumerate(sorted(deadlines), start=1):
        if d > step and (last_step is None or d <= last_step) and count > (d - step) * train_groups:
            return d
    return None


def short_of_supply(pool_groups: int, train_groups: int, lookahead: int, steps_left: int,
                    whole_batches: bool = False) -> bool:
    """Whether the pool, after this step's regular generation, holds fewer groups than this step and
    the ``lookahead`` after it train on (``steps_left``: this step and the ones after it).
    ``whole_batches`` (on_stale=wait): short only by a whole batch (``train_groups``), so a batch
    more never takes the pool past that count ("Deadlines": no group may have to be dropped)."""
    need = train_groups * max(0, min(1 + lookahead, steps_left))
    return pool_groups + (train_groups - 1 if whole_batches else 0) < need


def supply_lookahead(rule_steps: int, ahead: int, max_staleness: int) -> int:
    """How many steps past this one the supply fills the pool for: the auto rule's ``rule_steps``, at
    most ``ahead + max_staleness`` (``ahead``: the batches generation runs ahead, v1: 0 or 1).

    Supply batches are born at the latest step generated for, L = this step + ``ahead``; a group born
    at L must be trained by step L + ``max_staleness``, so the steps from this one to then train
    ``ahead + max_staleness + 1`` steps' worth of groups: a pool filled for more holds groups that
    can never be trained in time, and with every score in they are dropped (tests/strategies/test_pool.py; the
    3-seed heavy-tail benchmark before this cap, bench/results/e2e.json at 06e6690, dropped 8-10
    groups a run at lookahead 4 with max_staleness 2). In a scratch discrete-event model of the pool
    (lognormal latency, p99 of 2.5 and 5 step computes) a deeper supply was also slower in every
    case tried but one (max_staleness 0 at p99 = 5 computes)."""
    return max(0, min(rule_steps, ahead + max_staleness))


def auto_staleness_bound(deadline_s: float, step_compute_s: Sequence[float], current: int) -> int:
    """``max_staleness: auto``: the steps a group may be carried so the agent's ticket deadline settles
    it before it is due, ``ceil(deadline / median step compute)``, and never below ``current`` (the
    bound in force). No measurement yet: ``current``."""
    computes = [c for c in step_compute_s if c > 0 and not math.isnan(c)]
    if not computes or not deadline_s > 0:
        return current
    return max(current, math.ceil(deadline_s / statistics.median(computes) - 1e-9))


def auto_lookahead(reward_latency_s: float, step_compute_s: float, *, min_steps: int = 0, max_steps: int) -> int:
    """Batches to generate ahead so that rewards arrive before they are trained on:
    ``ceil(latency / compute)`` clamped to ``[min_steps, max_steps]`` (no measurement yet: 1)."""
    if max_steps < min_steps:
        raise ValueError(f"max_steps {max_steps} < min_steps {min_steps}")
    if step_compute_s <= 0 or reward_latency_s < 0 or math.isnan(reward_latency_s) or math.isnan(step_compute_s):
        return max(min_steps, min(1, max_steps))
    return max(min_steps, min(max_steps, math.ceil(reward_latency_s / step_compute_s - 1e-9)))
