"""Data sets evalpipe generates itself (see :mod:`evalpipe.data.gsm_synth`)."""
