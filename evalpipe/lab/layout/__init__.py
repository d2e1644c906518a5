"""The reference layout model: a vLLM plugin model whose decoder layers emulate the token
layout of T tensor-parallel ranks around attention (legacy gather/reduce-scatter vs
sequence-parallel pass-through), with switchable faults. See ``model`` for the layouts,
``faults`` for the faults, ``settings`` for how a variant selects them.

Importing this package does not import vLLM or torch.
"""
