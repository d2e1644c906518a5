"""The run config: its strict, frozen models, loading with `extends:` and one-sentence
errors (run_config), and what evalpipe knows of vLLM's engine arguments (engine_args).
"""
