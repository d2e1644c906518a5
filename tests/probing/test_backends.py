"""evalpipe/probing/backends.py: the doctor's reading of which attention backend a variant's
vLLM will build on a CPU (tests/engine_patches/test_backend_choice.py asks the real vLLM).
Pinned: an answer becomes a choice, a reason, or nothing off the CPU platform; a backend that
cannot take the model's dtype fails with the fix (for the AMX MLA backend: CPU_MLA or
bfloat16); an expectation naming another backend fails; otherwise it passes."""

from __future__ import annotations

from evalpipe.probing.backends import BackendChoice, answered, expected_backends, judge

AMX = {"use_mla": True, "dtype": "float32", "backend": "AMX_MLA", "supported_dtypes": ["bfloat16", "float16"],
       "amx_tile": True, "avx512_bf16": True}


def test_an_answer_is_a_choice_a_reason_or_nothing_off_the_cpu_platform():
    assert answered({"error": "no config.json"}) == "vLLM could not say which attention backend it will build: no config.json"
    assert answered({"platform": "npu"}) is None
    choice = answered(AMX)
    assert isinstance(choice, BackendChoice) and choice.processor() == "this processor has AMX tiles and AVX-512 bf16"


def test_a_backend_that_cannot_take_the_dtype_fails_with_the_fix():
    ok, sentence = judge(BackendChoice(**AMX), None)
    assert not ok and "takes bfloat16, float16 weights, not float32" in sentence
    assert "`attention_backend: CPU_MLA`" in sentence and sentence.endswith(".")


def test_an_expectation_naming_another_backend_fails_and_a_matching_one_passes():
    chosen = BackendChoice(**{**AMX, "dtype": "bfloat16"})
    assert expected_backends({}) is None and expected_backends({"attention_backends": "CPU_MLA"}) == ["CPU_MLA"]
    ok, sentence = judge(chosen, ["CPU_MLA"])
    assert not ok and "INCONCLUSIVE" in sentence and "attention_backend: CPU_MLA" in sentence
    assert judge(chosen, ["AMX_MLA"]) == (True, "vLLM's CPU platform builds AMX_MLA for this MLA model "
                                                "(this processor has AMX tiles and AVX-512 bf16), bfloat16, as expected")
