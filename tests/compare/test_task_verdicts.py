"""Each task's own verdict (compare.task_verdicts): its own evidence and gates, the variant's
paths, and only its own requirements of vLLM's counters."""

from fakes import make_samples, mutate, set_token, tables

from evalpipe.compare import Status, compare_tables
from evalpipe.compare.code_paths import ModelProbe, PathSide, ProcessProbe, VariantProbes
from evalpipe.config.expectations import Expectations
from evalpipe.documents.manifest import EngineCounters

MODEL = "pkg.Model"


def two_tasks(b_mut=None):
    a = make_samples(10, task="scenario_prefix_cache") + make_samples(10, task="gsm8k", seed=3)
    b = b_mut(a) if b_mut else a
    return a, b


def compare(a, b, paths=None, **kw):
    sa, ta = tables(a)
    sb, tb = tables(b)
    return compare_tables(sa, ta, sb, tb, label_a="legacy", label_b="sp", paths=paths, **kw)


def statuses(vc) -> dict[str, Status]:
    return {t.task: t.status for t in vc.doc.tasks}


def records() -> VariantProbes:
    built = ModelProbe(model_class=MODEL, layers={"pkg.Layer": 2}, attention_backends=["CPU_ATTN"], forwards=4,
                       forward_tokens=[], per_forward={})
    return VariantProbes(variant="v", mode="offline", verifiable=True, names={MODEL: MODEL}, processes=[
        ProcessProbe(variant="v", pid=1, ppid=0, process_name="w", role="worker", argv=[], started_at=0.0, updated_at=0.0,
                     models=[built], switches={}, switch_errors={}, calls={}, collectives={}, shapes={}, absent={}, errors=[])])


def sides(hits_b: int, model_b: str = MODEL, same_path: bool = False) -> tuple[PathSide, PathSide]:
    expect = {"model": MODEL, "tasks": {"scenario_prefix_cache": {"prefix_cache_hits": {"min": 1}}}}
    hit = {"scenario_prefix_cache": EngineCounters(prefix_cache_hits=896, prefix_cache_queries=1024)}
    b_counts = {"scenario_prefix_cache": EngineCounters(prefix_cache_hits=hits_b, prefix_cache_queries=1024)}
    return (PathSide("legacy", Expectations.model_validate(expect), records(), hit),
            PathSide("sp", Expectations.model_validate({**expect, "model": model_b, "same_path": same_path}), records(), b_counts))


def test_a_divergence_in_one_task_is_that_tasks_verdict_not_the_others():
    a, b = two_tasks(lambda s: mutate(s, 2, set_token(3, 7), task="scenario_prefix_cache"))
    vc = compare(a, b)
    assert vc.status is Status.DIVERGENT
    assert statuses(vc) == {"gsm8k": Status.IDENTICAL, "scenario_prefix_cache": Status.DIVERGENT}
    bad = next(t for t in vc.doc.tasks if t.task == "scenario_prefix_cache")
    assert bad.gates_failed >= 1 and any("scenario_prefix_cache" in r for r in bad.reasons)


def test_a_scenario_whose_path_did_not_run_is_inconclusive_alone():
    a, b = two_tasks()
    vc = compare(a, b, paths=sides(hits_b=0))
    assert vc.status is Status.INCONCLUSIVE
    assert statuses(vc) == {"gsm8k": Status.IDENTICAL, "scenario_prefix_cache": Status.INCONCLUSIVE}
    prefix = next(t for t in vc.doc.tasks if t.task == "scenario_prefix_cache")
    assert prefix.reasons[0].startswith("variant `sp`: task `scenario_prefix_cache` was to drive")
    assert prefix.outputs_status is Status.IDENTICAL


def test_a_variant_that_ran_other_code_makes_every_task_inconclusive():
    a, b = two_tasks()
    vc = compare(a, b, paths=sides(hits_b=896, model_b="pkg.Other"))
    assert set(statuses(vc).values()) == {Status.INCONCLUSIVE}


def test_when_every_path_ran_each_task_keeps_what_its_outputs_say():
    a, b = two_tasks(lambda s: mutate(s, 2, set_token(3, 7), task="gsm8k"))
    vc = compare(a, b, paths=sides(hits_b=896, same_path=True))  # an A/A pair: the same code meant
    assert statuses(vc) == {"gsm8k": Status.DIVERGENT, "scenario_prefix_cache": Status.IDENTICAL}


def test_the_same_code_on_both_sides_proves_nothing_for_any_task():
    a, b = two_tasks()
    vc = compare(a, b, paths=sides(hits_b=896))
    assert set(statuses(vc).values()) == {Status.INCONCLUSIVE}


def test_a_side_compared_unverified_makes_every_task_inconclusive():
    a, b = two_tasks()
    vc = compare(a, b, unverified=["sp"])
    assert set(statuses(vc).values()) == {Status.INCONCLUSIVE}
    assert all(t.reasons[0].startswith("compared unverified") for t in vc.doc.tasks)
