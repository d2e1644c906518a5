"""Engine arguments as vLLM flags (evalpipe/execution/engine_flags.py), the way vLLM turns its
--config file into flags; vLLM's own parser reads them back to the same values
(tests/e2e/test_deployment.py starts a real deployment from them)."""

from __future__ import annotations

import shlex

from evalpipe.execution.engine_flags import as_flags, shell_line


def test_each_kind_of_value_becomes_vllm_s_words():
    args = {"tensor_parallel_size": 16, "enable_expert_parallel": True, "enable_prefix_caching": False,
            "additional_config": {"enable_dsa_cp": True}, "served_model_name": ["a", "b"], "quantization": None,
            "api_server_count": [], "seed": 0}
    assert as_flags(args) == ["--tensor-parallel-size", "16", "--enable-expert-parallel", "--no-enable-prefix-caching",
                              "--additional-config", '{"enable_dsa_cp":true}', "--served-model-name", "a", "b",
                              "--seed", "0"]


def test_a_shell_line_runs_as_the_same_words():
    argv = ["vllm", "serve", "--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY"}', "--x", "it's"]
    assert shlex.split(shell_line(argv)) == argv
