"""The planning aid of a sampled run (`evalpipe run --dry-run`): for each sampled task, the
samples the run will draw, what they can see, and the items a smaller effect would need.

Two effects are sized. A divergent-sample rate: with common random numbers an equivalent
engine leaves the reference's path (almost) never, so one divergent sample is already
evidence; the sampled gates see a rate r once a run holds enough samples that at least one
diverges with the asked power. An avg@n difference: per item the paired difference of the
n samples' mean score, whose spread follows from the share of samples whose correctness
differs between the sides (the discordance), and the usual paired sample size."""

from __future__ import annotations

import math

from evalpipe.compare.sampling import avg_at_n_spread, items_for_difference, samples_to_see
from evalpipe.config.run_config import TaskSpec

POWER_TO_SEE = 0.95  # a divergent sample seen at least once
POWER = 0.8  # the score difference's test
ALPHA = 0.05
RATES = (0.01, 0.001)  # divergent-sample rates to size for
DIFFERENCES = (0.02, 0.01)  # avg@n differences to size for
DISCORDANCE = 0.05  # share of samples whose correctness differs between the sides, when sizing for a difference


def smallest_rate_seen(samples: int, power: float = POWER_TO_SEE) -> float:
    """The smallest divergent-sample rate that ``samples`` samples show at least once with ``power``."""
    return -math.expm1(math.log1p(-power) / samples)


def smallest_difference(items: int, samples: int, discordance: float = DISCORDANCE) -> float:
    """The avg@n difference ``items`` items of ``samples`` samples detect (paired, ALPHA, POWER)."""
    from scipy.stats import norm  # noqa: PLC0415 - scipy's import is slow; a dry run of a greedy config never needs it

    z = norm.ppf(1 - ALPHA / 2) + norm.ppf(POWER)
    return z * avg_at_n_spread(samples, discordance) / math.sqrt(items)


def plan_lines(spec: TaskSpec) -> list[str]:
    """What a sampled task's samples can see and what smaller effects would need (greedy: none)."""
    s = spec.sampling
    if s is None:
        return []
    n = s.samples
    lines = []
    if spec.limit is None:
        lines.append(f"{spec.task}: every item x {n} sample(s) per variant (--limit N sizes the run); what an effect needs:")
    else:
        total = spec.limit * n
        lines.append(f"{spec.task}: {spec.limit} items x {n} sample(s) = {total} samples per variant; they show a "
                     f"divergent-sample rate of {smallest_rate_seen(total):.2%} or more at least once with "
                     f"{POWER_TO_SEE:.0%} probability (one fails sampled_excess_divergence where the distributions "
                     f"allow none), and an avg@{n} difference of {smallest_difference(spec.limit, n):.3f} "
                     f"or more ({POWER:.0%} power, alpha {ALPHA:g}, {DISCORDANCE:.0%} of samples discordant); what a smaller "
                     "effect needs:")
    for rate in RATES:
        need = samples_to_see(rate, POWER_TO_SEE)
        lines.append(f"  a divergent-sample rate of {rate:.1%}: {need} samples ({math.ceil(need / n)} items x {n})")
    for difference in DIFFERENCES:
        items = items_for_difference(avg_at_n_spread(n, DISCORDANCE), difference, ALPHA, POWER)
        lines.append(f"  an avg@{n} difference of {difference:g} at {DISCORDANCE:.0%} discordant samples: {items} items x {n}")
    return lines
