"""evalpipe: prove that an inference-engine change preserves model outputs."""

__version__ = "0.1.0"
