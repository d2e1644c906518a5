"""The gates' registry: what each gate is, in one place (evalpipe/gates/registry.py).

config builds the gate settings from it, compare measures each gate by name, numerics
reads its floors, nightly follows its series and the reports its label; a gate added
here and nowhere else fails tests/gates/test_registry.py until it has all of them.
"""
