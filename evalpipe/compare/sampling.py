"""Sampled comparisons with common random numbers: how far the paths of two samplers that
drew the same random numbers agree, and whether their divergences are what the two
distributions explain.

Every sample of a sampled task was drawn with its own seed, the same on both sides
(:mod:`evalpipe.config.sampling`). vLLM's sampler turns a seed into noise per generation
step (an exponential race over the vocabulary, the Gumbel-max trick), so at a position
where both sides' sampling distributions are equal they pick the same token, and where
they differ by total variation TV they pick different tokens with probability at most
``2·TV/(1+TV)`` (the coupling bound of the Gumbel-max / exponential race). Along a
sample, the reference's path is teacher-forced through the variant, which gives both
distributions at every step; the probability that the variant's sample leaves that path
is then at most ``1 − Π(1 − b_i)`` over its steps.

Measured here per task:

* the divergent samples (free-running first divergence: the ids differ somewhere), where
  divergences start, and the sampled tokens' logprobs where the paths agree;
* the divergent samples the distributions predict (the sum of the per-sample bounds) and
  the probability of seeing at least as many if each sample diverged independently with
  its bound (Poisson-binomial upper tail, exact): small means more divergences than the
  distributions explain, the sampler itself or a difference the top-k does not hold;
* pass@k per item (the unbiased estimator of its n samples), paired between the sides.
  avg@n is the score comparison itself: a sampled row is one sample and its item is its
  cluster, so the paired difference and its interval are per item (cluster-robust).

The sampling distribution is computed from each position's captured top-k raw logprobs:
tempered, cut by top_k, top_p and min_p as vLLM cuts them, renormalised over what is kept.
The mass outside the captured top-k is taken as unreachable; where sampling could reach
beyond the k-th token the TV is an estimate, so a sampled run captures more (capture.topk).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from evalpipe.compare import stats
from evalpipe.compare.scores import CONF, align_keys
from evalpipe.compare.token_results import TokenComparison, prefix_values
from evalpipe.compare.topk import TopK, topk_width
from evalpipe.config.sampling import Sampler
from evalpipe.documents.comparison import PassAtK, SampledTask
from evalpipe.rundir import artifacts

SETTINGS = ("temperature", "top_p", "top_k", "min_p")
ROWS_PER_BLOCK = 1 << 15  # positions whose k x k id matches are held at once


# ---------------------------------------------------------------------------
# distributions
# ---------------------------------------------------------------------------


def sampling_distribution(ids: np.ndarray, lps: np.ndarray, s: Sampler) -> np.ndarray:
    """Per row, the probability the sampler gives each listed id: ``lps`` (raw logprobs,
    -inf where a row has fewer than k entries, ids -1 there) tempered, then min_p, top_k
    and top_p applied to the tempered probabilities, renormalised over the tokens kept."""
    lps = np.asarray(lps, dtype=np.float64)
    valid = (np.asarray(ids) >= 0) & np.isfinite(lps)
    order = np.argsort(np.where(valid, -lps, np.inf), axis=1, kind="stable")  # best first
    ranked = np.take_along_axis(np.where(valid, lps, -np.inf), order, axis=1) / s.temperature
    best = ranked[:, :1]
    with np.errstate(invalid="ignore"):
        mass = np.where(np.isfinite(ranked), np.exp(ranked - np.where(np.isfinite(best), best, 0.0)), 0.0)
    keep = mass > 0
    if s.min_p > 0:
        keep &= mass >= s.min_p * mass[:, :1]
    if s.top_k and ranked.shape[1] > s.top_k:
        # vLLM masks only logits below the k-th largest: a token tied with it stays
        keep &= ranked >= ranked[:, s.top_k - 1:s.top_k]
    if s.top_p < 1:
        kept = np.where(keep, mass, 0.0)
        total = kept.sum(axis=1, keepdims=True)
        before = np.cumsum(kept, axis=1) - kept  # mass of the better tokens kept
        keep &= before < s.top_p * np.where(total > 0, total, 1.0)
    mass = np.where(keep, mass, 0.0)
    total = mass.sum(axis=1, keepdims=True)
    probs_ranked = mass / np.where(total > 0, total, 1.0)
    out = np.zeros_like(probs_ranked)
    np.put_along_axis(out, order, probs_ranked, axis=1)
    return out


def total_variation(ids_a: np.ndarray, p_a: np.ndarray, ids_b: np.ndarray, p_b: np.ndarray) -> np.ndarray:
    """Per row, ½·Σ|p_a − p_b| over the union of both rows' ids (an id one side lacks has
    probability 0 there)."""
    n = len(ids_a)
    out = np.zeros(n, dtype=np.float64)
    for lo in range(0, n, ROWS_PER_BLOCK):
        hi = min(n, lo + ROWS_PER_BLOCK)
        ia, ib = ids_a[lo:hi], ids_b[lo:hi]
        pa_, pb_ = p_a[lo:hi], p_b[lo:hi]
        same = (ia[:, :, None] == ib[:, None, :]) & (ia[:, :, None] >= 0)
        b_at_a = np.einsum("ijl,il->ij", same, pb_)
        matched_b = same.any(axis=1)
        out[lo:hi] = 0.5 * (np.abs(pa_ - b_at_a).sum(axis=1) + np.where(matched_b, 0.0, pb_).sum(axis=1))
    return np.clip(out, 0.0, 1.0)


def coupling_bound(tv: np.ndarray) -> np.ndarray:
    """The most often two Gumbel-max (exponential race) samplers with the same noise can pick
    different tokens from distributions at total variation ``tv``."""
    return 2.0 * tv / (1.0 + tv)


def leave_probability(bounds: np.ndarray, sample: np.ndarray, n_samples: int) -> np.ndarray:
    """Per sample, 1 − Π(1 − b) over its positions (``sample[i]`` owns ``bounds[i]``)."""
    log_stay = np.bincount(sample, weights=np.log1p(-np.minimum(bounds, 1.0 - 1e-16)), minlength=n_samples)
    return -np.expm1(log_stay)


def upper_tail(probs: np.ndarray, k: int) -> float:
    """P(X ≥ k) for X the number of successes of independent Bernoulli(probs) trials
    (Poisson-binomial), exactly: the distribution of the count up to k − 1, one trial at a time."""
    if k <= 0:
        return 1.0
    below = np.zeros(k)  # P(X = j) for j < k, the mass at k and above dropped
    below[0] = 1.0
    for p in np.asarray(probs, dtype=np.float64):
        below[1:] = below[1:] * (1.0 - p) + below[:-1] * p
        below[0] *= 1.0 - p
    return float(min(1.0, max(0.0, 1.0 - below.sum())))


# ---------------------------------------------------------------------------
# pass@k and planning
# ---------------------------------------------------------------------------


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k of an item with ``correct`` of ``n`` samples right: 1 − C(n−c, k)/C(n, k)."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.comb(n - correct, k) / math.comb(n, k)


def ks_of(n: int) -> list[int]:
    """The k reported for n samples per item: 1, the powers of two below n, and n."""
    return sorted({1, n, *(2**i for i in range(1, n.bit_length()) if 2**i < n)})


def samples_to_see(rate: float, power: float = 0.95) -> int:
    """Samples needed to see at least one divergent sample with probability ``power`` when
    each diverges with probability ``rate`` (and none in the A/A run)."""
    if not 0 < rate < 1 or not 0 < power < 1:
        raise ValueError("rate and power are probabilities strictly between 0 and 1")
    return math.ceil(math.log1p(-power) / math.log1p(-rate))


def items_for_difference(sd: float, difference: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Items a paired two-sided test at level ``alpha`` needs to detect a mean per-item
    difference ``difference`` with ``power``, the per-item differences having spread ``sd``."""
    if sd <= 0 or difference <= 0:
        raise ValueError("the spread and the difference are positive")
    z = stats.quantile(1 - alpha / 2, None) + stats.quantile(power, None)
    return math.ceil((z * sd / difference) ** 2)


def avg_at_n_spread(samples: int, discordance: float) -> float:
    """The spread of one item's paired avg@n difference when each of its ``samples`` differs in
    correctness between the sides with probability ``discordance`` (either way, ±1 each): the
    variance of one sample's difference is the discordance, the mean of n divides it by n.
    Samples of one item are taken as independent; correlated ones spread more."""
    return math.sqrt(discordance / samples)


# ---------------------------------------------------------------------------
# per task
# ---------------------------------------------------------------------------


def samplers(samples: pa.Table) -> dict[str, Sampler]:
    """Each sampled task's sampler, as its rows record it (greedy tasks: absent)."""
    if "temperature" not in samples.column_names:
        return {}
    cols = samples.select(["task", *SETTINGS]).to_pydict()
    out: dict[str, Sampler] = {}
    for task, t, p, k, m in zip(cols["task"], *(cols[c] for c in SETTINGS)):
        if t is not None and task not in out:
            out[task] = Sampler.recorded(float(t), float(p), int(k or 0), float(m))
    return out


def _teacher_bounds(teacher: TokenComparison, teacher_a: pa.Table, teacher_b: pa.Table,
                    by_task: dict[str, Sampler]) -> tuple[np.ndarray, np.ndarray]:
    """Per teacher-forced sample: the probability bound of leaving the reference's path
    (NaN for a sample of a greedy task or without continuation positions), and its TV's
    largest value."""
    d, pal = teacher.samples, teacher.positions
    n = 0 if d is None else len(d)
    leave, tv_max = np.full(n, np.nan), np.full(n, np.nan)
    if d is None or pal is None or d.prefix_rows is None or not len(prefix_values(d.prefix_rows)):
        return leave, tv_max
    rows, owner = prefix_values(d.prefix_rows), prefix_values(d.prefix_sample)
    continuation = pal.codes[3][rows] >= 0  # prompt positions (negative) were never sampled
    rows, owner = rows[continuation], owner[continuation]
    k = topk_width(teacher_a, teacher_b)
    ids_a, lps_a = TopK.of(teacher_a, k).take(pal.idx_a[rows])
    ids_b, lps_b = TopK.of(teacher_b, k).take(pal.idx_b[rows])
    tv = np.zeros(len(rows))
    task_of_owner = d.task[owner]
    for task, sampler in by_task.items():
        here = task_of_owner == task
        if here.any():
            tv[here] = total_variation(ids_a[here], sampling_distribution(ids_a[here], lps_a[here], sampler),
                                       ids_b[here], sampling_distribution(ids_b[here], lps_b[here], sampler))
    sampled = np.isin(task_of_owner, list(by_task))
    probability = leave_probability(np.where(sampled, coupling_bound(tv), 0.0), owner, n)
    has = np.bincount(owner[sampled], minlength=n) > 0
    leave[has] = probability[has]
    largest = np.full(n, -np.inf)
    np.maximum.at(largest, owner[sampled], tv[sampled])
    tv_max[has] = largest[has]
    return leave, tv_max


def _key_index(task: np.ndarray, doc: np.ndarray, rep: np.ndarray) -> dict[tuple[str, int, int], int]:
    return {(str(t), int(dd), int(r)): i for i, (t, dd, r) in enumerate(zip(task, doc, rep))}


def sampled_tasks(
    samples_a: pa.Table,
    samples_b: pa.Table,
    tokens: TokenComparison,
    teacher: TokenComparison | None = None,
    teacher_a: pa.Table | None = None,
    teacher_b: pa.Table | None = None,
    conf: float = CONF,
) -> list[SampledTask] | None:
    """The sampled comparison of every sampled task; None when no task was sampled."""
    by_task = samplers(samples_a)
    if not by_task:
        return None
    d = tokens.samples
    if d is None:
        return None
    leave_at: dict[tuple[str, int, int], tuple[float, float]] = {}
    if teacher is not None and teacher.samples is not None and teacher_a is not None and teacher_b is not None:
        leave, tv_max = _teacher_bounds(teacher, teacher_a, teacher_b, by_task)
        td = teacher.samples
        for key, i in _key_index(td.task, td.doc_id, td.repeat).items():
            if not np.isnan(leave[i]):
                leave_at[key] = (float(leave[i]), float(tv_max[i]))
    out = []
    for task in sorted(by_task):
        mine = np.flatnonzero((d.task == task) & d.paired)
        keys = [(task, int(d.doc_id[i]), int(d.repeat[i])) for i in mine]
        diverged = d.first_divergence[mine] >= 0
        starts = d.first_divergence[mine][diverged]
        predicted = [leave_at[k] for k in keys if k in leave_at]
        probs = np.array([p for p, _ in predicted])
        agreeing = d.shared_prefix[mine]
        largest = d.max_abs_dlogprob[mine]
        finite = largest[~np.isnan(largest)]
        n_div = int(diverged.sum())
        out.append(SampledTask(
            task=task,
            **by_task[task].model_dump(exclude={"top_k"}), top_k=by_task[task].vllm_top_k,
            samples_per_item=int(d.repeat[mine].max()) + 1 if len(mine) else 0,
            items=len({k[1] for k in keys}),
            samples=len(mine),
            divergent=n_div,
            divergent_rate=n_div / len(mine) if len(mine) else math.nan,
            first_divergence_min=int(starts.min()) if len(starts) else None,
            first_divergence_median=float(np.median(starts)) if len(starts) else None,
            agreeing_positions=int(agreeing.sum()),
            max_abs_dlogprob=float(finite.max()) if len(finite) else None,
            predicted_samples=len(predicted),
            predicted=float(probs.sum()) if len(predicted) else None,
            excess_p=upper_tail(probs, n_div) if len(predicted) == len(mine) and len(mine) else None,
            tv_max=float(max(t for _, t in predicted)) if predicted else None,
            pass_at=pass_at_ks(samples_a, samples_b, task, conf),
        ))
    return out


def pass_at_ks(samples_a: pa.Table, samples_b: pa.Table, task: str, conf: float = CONF) -> list[PassAtK]:
    """pass@k of every 0/1 metric of ``task`` per item on each side, paired over the items both have."""
    a = samples_a.filter(pc.equal(samples_a.column("task"), task))
    b = samples_b.filter(pc.equal(samples_b.column("task"), task))
    keys = ["task", "doc_id", "repeat"]
    al = align_keys(a.select(keys), b.select(keys), keys, "samples")
    both = al.in_a & al.in_b
    docs = al.codes[1][both]
    out = []
    for column in sorted(set(artifacts.score_columns(a)) & set(artifacts.score_columns(b))):
        va = _side_values(a, column, al.idx_a[both])
        vb = _side_values(b, column, al.idx_b[both])
        if not np.isin(np.concatenate([va, vb]), (0.0, 1.0)).all():  # NaN (a missing score) too
            continue  # pass@k is for right-or-wrong metrics
        items = np.unique(docs)
        n_per = np.array([int((docs == i).sum()) for i in items])
        n = int(n_per.min()) if len(items) else 0
        if n == 0:
            continue
        correct_a = np.array([int(va[docs == i].sum()) for i in items])
        correct_b = np.array([int(vb[docs == i].sum()) for i in items])
        for k in ks_of(n):
            pa_k = np.array([pass_at_k(int(m), int(c), k) for m, c in zip(n_per, correct_a)])
            pb_k = np.array([pass_at_k(int(m), int(c), k) for m, c in zip(n_per, correct_b)])
            diff = stats.paired_difference(pa_k, pb_k, conf=conf)
            out.append(PassAtK(metric=column.removeprefix(artifacts.SCORE_PREFIX), k=k, items=len(items),
                               a=float(pa_k.mean()), b=float(pb_k.mean()), delta=diff.diff,
                               ci_low=diff.ci_low, ci_high=diff.ci_high))
    return out


def _side_values(table: pa.Table, column: str, rows: np.ndarray) -> np.ndarray:
    values = np.asarray(table.column(column).cast(pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    return values[rows]


def reproducibility_problem(aa: Sequence[SampledTask], alpha: float) -> str | None:
    """Why the A/A run's samples show the engine does not reproduce a seeded sample (or
    None): it drew other tokens in more samples than its own distributions explain."""
    for t in aa:
        if t.divergent == 0:
            continue
        unexplained = (t.excess_p is not None and t.excess_p < alpha) or (t.tv_max is not None and t.tv_max == 0)
        if unexplained:
            predicted = "no divergence" if not t.predicted else f"{t.predicted:.3g} divergent samples at most"
            return (f"the engine is not reproducible under these sampling settings ({t.sampler.describe()}, "
                    f"one seed per sample): the A/A run (the reference again, same seeds, other batches) drew other tokens in "
                    f"{t.divergent} of {t.samples} samples of {t.task} where its distributions predict {predicted}; seeds not "
                    "honoured, or a sampler that draws per batch (docs/sampling.md), so no sampled comparison can be judged")
    return None
