"""Trainer strategies that overlap reward waiting with compute: the mini-batch pipeline and
k-step off-policy generation. ``plan`` and ``timing`` are pure; the verl-facing trainers are thin."""
