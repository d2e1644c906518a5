"""evalpipe/probes/patching.py in this process: wrapping keeps static and class methods and wraps once, refuses what is not a function, and counting skips calls while the engine compiles."""

from __future__ import annotations

import inspect

import pytest

from evalpipe.probes.patching import MARK, counting, wrap


def _count_into(calls: list):
    return lambda fn: counting(fn, lambda a, k: calls.append(a) or True, lambda token: None, lambda: False)


def test_wrap_keeps_static_and_class_methods_and_wraps_once():
    class Base:
        def inherited(self):
            return "base"

    class K(Base):
        @staticmethod
        def s(x):
            return x + 1

        @classmethod
        def c(cls):
            return cls.__name__

    class Sub(K):
        pass

    calls: list = []
    assert wrap(K, "s", _count_into(calls)) and wrap(K, "c", _count_into(calls)) and wrap(K, "inherited", _count_into(calls))
    assert not wrap(K, "s", _count_into(calls)), "a name is never wrapped twice"
    assert isinstance(inspect.getattr_static(K, "s"), staticmethod)
    assert isinstance(inspect.getattr_static(K, "c"), classmethod)
    assert (K.s(1), K().s(2), K.c(), Sub.c(), Sub().inherited(), Base().inherited()) == (2, 3, "K", "Sub", "base", "base")
    assert len(calls) == 5, "Base's own inherited() is not wrapped"
    assert "inherited" not in vars(Base) or not getattr(vars(Base)["inherited"], MARK, False)


def test_wrap_refuses_what_is_not_a_function():
    class K:
        X = 1

        @property
        def p(self):
            return 1

        class Inner:
            pass

    for name, what in (("X", "int"), ("p", "property"), ("Inner", "class")):
        with pytest.raises(TypeError, match=f"{name} is a {what}, not a function or method"):
            wrap(K, name, _count_into([]))
    with pytest.raises(AttributeError):
        wrap(K, "missing", _count_into([]))


def test_counting_skips_calls_while_compiling():
    seen: list = []
    compiling = [False]
    fn = counting(lambda x: x * 2, lambda a, k: seen.append(a), lambda token: None, lambda: compiling[0])
    assert fn(2) == 4
    compiling[0] = True
    assert fn(3) == 6
    assert seen == [(2,)]
