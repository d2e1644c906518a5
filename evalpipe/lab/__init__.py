"""The lab: what evalpipe uses to test itself, not to test an engine — the reference
layout model with its fault zoo (lab.layout, a vLLM plugin model), and the training of
the built-in models (lab.training, lab.build). Only calibration and the maintainers'
model builds import it; a run reaches the layout model only through vLLM's plugin entry
point, when a config loads it.
"""
