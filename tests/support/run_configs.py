"""The smallest run config with two variants and one task group, as a mapping to vary."""

MINIMAL = {
    "model": {"path": "builtin:tiny-gsm"},
    "variants": {"a": {}, "b": {"env": {"X": 1}}},
    "tasks": {"gsm8k": {"task": "gsm8k_synth_4shot", "num_fewshot": 4}},
}
