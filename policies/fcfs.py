"""First come, first served: decode slots go to the earliest arrivals."""

from __future__ import annotations

from policies.base import Policy, SchedulerView


class FCFS(Policy):
    name = "fcfs"
    uses_predictions = False

    def decode_keys(self, view: SchedulerView, rows):
        return None
