"""The planning aid of the engine-path tasks (`evalpipe run --dry-run`): how many requests
each scenario (or task with a schedule or `requires:` of its own) sends per variant, the
smallest share of them a divergence must touch to show with the asked probability, and the
requests a smaller share needs.

Greedy decoding on an fp32 engine repeats itself bitwise (the A/A run shows it), so one
request that diverges beyond the floors is already evidence: a divergence touching a share
r of a path's requests shows with probability 1 - (1 - r)^n in n of them."""

from __future__ import annotations

from evalpipe.commands.sampling_plan import POWER_TO_SEE, smallest_rate_seen
from evalpipe.compare.sampling import samples_to_see
from evalpipe.config.run_config import TaskSpec
from evalpipe.data.scenarios import GENERATED_SCENARIOS, ScenarioSpec

RATES = (0.05, 0.01)  # shares of a path's requests a divergence touches, to size for


def drives_a_path(spec: TaskSpec) -> bool:
    """A task run for the engine path it drives: a scenario, or a schedule or `requires:` of its own."""
    return spec.task in GENERATED_SCENARIOS or spec.requires is not None or spec.sends != "together"


def requests_sent(spec: TaskSpec, scenarios: ScenarioSpec) -> int | None:
    """Requests per variant (None: every item of a data set not read before the run)."""
    made = scenarios.requests(spec.task) if spec.task in GENERATED_SCENARIOS else None
    if made is None:
        return spec.limit
    return made if spec.limit is None else min(made, spec.limit)


def path_lines(spec: TaskSpec, scenarios: ScenarioSpec) -> list[str]:
    """What a greedy path-driving task's requests can see (sampled tasks: sampling_plan; others: none)."""
    if spec.sampling is not None or not drives_a_path(spec):
        return []
    n = requests_sent(spec, scenarios)
    need = ", ".join(f"{rate:.0%}: {samples_to_see(rate, POWER_TO_SEE)} requests" for rate in RATES)
    if n is None:
        return [f"{spec.task}: every item, sent {spec.sends.replace('_', ' ')} (--limit N sizes it); a divergence "
                f"touching a share of the requests needs, to show at least once with {POWER_TO_SEE:.0%} probability: {need}"]
    return [f"{spec.task}: {n} requests per variant, sent {spec.sends.replace('_', ' ')}; a divergence touching "
            f"{smallest_rate_seen(n):.1%} of them or more shows in at least one with {POWER_TO_SEE:.0%} probability "
            f"(one beyond the floors fails the token gates); a smaller share needs {need}"]
