"""What a caller sends: one response to score (``RewardItem``), and the check that its text can be
sent at all. Plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Hashable


@dataclass(slots=True)
class RewardItem:
    """One response to score. ``index`` is the sample's position in the submitted batch. (Not frozen:
    one is built per sample, and a frozen dataclass pays ``object.__setattr__`` per field.)"""

    index: int
    solution_str: str
    ground_truth: Any = None
    data_source: str = ""
    extra_info: dict | None = None
    uid: Hashable | None = None


SENT_TEXT_FIELDS = ("solution_str", "ground_truth", "data_source")


def unsendable_text(item: RewardItem) -> str | None:
    """Why ``item``'s text cannot be sent to a judge, or None. A lone surrogate (half of a UTF-16
    pair: text cut inside an emoji, or a ``\\ud83d`` escape in JSON input) has no UTF-8 encoding, so
    no HTTP request can carry it: found before the first attempt, the sample fails as ``invalid``
    instead of being retried as if the judge had answered badly."""
    for name in SENT_TEXT_FIELDS:
        text = getattr(item, name)
        if type(text) is str and not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (f"{name} is not valid Unicode: a lone surrogate {text[exc.start]!a} at character "
                        f"{exc.start} (half of a UTF-16 pair: text cut inside an emoji, or an escape such as "
                        "\\ud83d in JSON input): it has no UTF-8 encoding, so no request can carry it")
    return None
