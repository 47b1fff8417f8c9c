"""KL-in-reward under the pipeline, as verl computes it for the whole batch.

verl's ``apply_kl_penalty`` penalises rewards with ``beta = kl_ctrl.value`` and then calls
``kl_ctrl.update(current_kl, n_steps=batch_size)`` with the batch's mean per-sequence KL. Called once
per mini-batch, an adaptive controller would move K times per step and later mini-batches would
see another beta. ``DeferredKL`` stands in for the controller during a step: every mini-batch sees
the step's beta, and the real controller is updated once, with the batch's KL (the size-weighted mean
of the mini-batches' means is exactly the batch mean: each is a mean over sequences).
"""

from __future__ import annotations

from typing import Any


class DeferredKL:
    def __init__(self, controller: Any):
        self.controller = controller
        self.value = controller.value  # beta for the whole step
        self._kl_sum = 0.0
        self._sequences = 0

    def update(self, current_kl: float, n_steps: int) -> None:
        self._kl_sum += float(current_kl) * int(n_steps)
        self._sequences += int(n_steps)

    @property
    def observed(self) -> bool:
        return self._sequences > 0

    def flush(self) -> dict[str, float]:
        """Update the real controller once; the step's ``actor/reward_kl_penalty*`` metrics."""
        if not self.observed:
            return {}
        current_kl = self._kl_sum / self._sequences
        self.controller.update(current_kl=current_kl, n_steps=self._sequences)
        return {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": self.value}
