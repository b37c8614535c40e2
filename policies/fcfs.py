"""First come, first served: decode slots go to the earliest arrivals."""

from __future__ import annotations

from policies.base import CompiledForm, Policy, SchedulerView


class FCFS(Policy):
    name = "fcfs"
    uses_predictions = False
    compiled = live = True

    def decode_keys(self, view: SchedulerView, rows):
        return None

    def compiled_form(self) -> CompiledForm:
        return CompiledForm(keys="row")
