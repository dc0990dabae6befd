"""The LLM-serving triggers this project recommends, in one place. The README, the chart's NOTES.txt and
example values, the CLI help, the demo's status lines and the manifests' examples all say this set;
tests/integration/test_recommended.py and test_examples.py check each against it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Recommended:
    role: str  # what the trigger is for, as the docs name it
    metadata: tuple[tuple[str, str], ...]  # its metadata keys (besides scalerAddress and the selection)

    @property
    def metric(self) -> str:
        return dict(self.metadata)["metric"]


# Sizing on the work arriving (tokens per second one replica serves: measure it with `calibrate`), a
# high `requests` guard for pods far past their concurrency, and `pending` to wake a pool from zero: one
# request held wakes it (activation is above 0); its threshold, 64 held per replica as the guard's 64 in
# flight, keeps it from outbidding `demand`, which sizes held requests already (at 1 it cost the
# simulator 10-30 % more GPU-seconds on mix-shift and the wake trace for no attainment).
LLM_TRIGGERS = (
    Recommended("sizing", (("metric", "demand"), ("demandUnit", "tokens"), ("threshold", "15000"))),
    Recommended("guard", (("metric", "requests"), ("threshold", "64"))),
    Recommended("wake", (("metric", "pending"), ("threshold", "64"))),
)
SIZING, GUARD, WAKE = LLM_TRIGGERS


def llm_summary() -> str:
    """One line naming the recommended LLM triggers, for the CLI help and the demo's banner."""
    parts = (f"{t.role} {' '.join(f'{k}={v}' for k, v in t.metadata)}" for t in LLM_TRIGGERS)
    return "LLM servers, recommended triggers: " + "; ".join(parts)
