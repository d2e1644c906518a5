"""Wrap functions and methods where they are defined, right after their module loads.

A module that imports a name (``from vllm.distributed import tensor_model_parallel_all_gather``)
binds the object it finds at that moment, so a wrapper must be in place before anyone
imports it: :class:`PostImportHooks` sits in ``sys.meta_path`` and runs a callback the
moment a watched module has executed, before the import statement that loaded it
returns. Methods are replaced on their class, so every caller sees the wrapper however it
reached the method.

Standard library only.
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import sys
import threading
from types import ModuleType
from typing import Any, Callable

MARK = "__evalpipe_probe__"  # set on every wrapper: a name is never wrapped twice


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks once the module has executed."""

    def __init__(self, loader: Any, loaded: Callable[[ModuleType], None]):
        self._loader = loader
        self._loaded = loaded

    def create_module(self, spec):  # noqa: ANN001 - importlib's protocol
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._loaded(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, get_resource_reader ...
        return getattr(self._loader, name)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """Callbacks per module name, run once that module has executed (at once when it already has)."""

    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._finding = threading.local()

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def when_loaded(self, module: str, callback: Callable[[ModuleType], None]) -> None:
        loaded = sys.modules.get(module)
        if loaded is not None and getattr(loaded, "__spec__", None) is not None and not _initializing(loaded):
            callback(loaded)
            return
        self._callbacks.setdefault(module, []).append(callback)

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001 - importlib's protocol
        callbacks = self._callbacks.get(fullname)
        busy = getattr(self._finding, "names", None)
        if not callbacks or (busy and fullname in busy):
            return None
        self._finding.names = (busy or set()) | {fullname}
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._finding.names = busy or set()
        if spec is None or spec.loader is None:
            return spec  # a namespace package has no code to wait for
        spec.loader = _Loader(spec.loader, self._run)
        return spec

    def _run(self, module: ModuleType) -> None:
        # kept until an import succeeds: a module whose first import failed half-way is imported again
        for callback in self._callbacks.pop(module.__name__, []):
            callback(module)


def _initializing(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def resolve(module: ModuleType, attr: str) -> tuple[Any, str]:
    """(the object that holds the last part, the last part) of ``attr`` ("Class.method") in ``module``."""
    owner: Any = module
    *parents, last = attr.split(".")
    for part in parents:
        owner = getattr(owner, part)
    return owner, last


def wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Replace ``owner.name`` by ``make(original)``; staticmethods and classmethods keep their
    kind, an inherited method is wrapped on ``owner`` (calls through ``owner`` and its
    subclasses count, the base's own do not). False when it is already wrapped; raises
    TypeError for something that is not callable (a property, a constant)."""
    raw = inspect.getattr_static(owner, name)
    kind = None
    if isinstance(raw, (staticmethod, classmethod)):
        kind, raw = type(raw), raw.__func__
    if getattr(raw, MARK, False):
        return False
    if isinstance(raw, (property, type)) or not callable(raw):
        what = "class" if isinstance(raw, type) else type(raw).__name__
        raise TypeError(f"{name} is a {what}, not a function or method")
    wrapper = make(raw)
    setattr(wrapper, MARK, True)
    setattr(owner, name, kind(wrapper) if kind else wrapper)
    return True


def counting(fn: Callable[..., Any], enter: Callable[[tuple, dict], Any], leave: Callable[[Any], None],
             compiling: Callable[[], bool]) -> Callable[..., Any]:
    """``fn`` with ``enter(args, kwargs)`` before and ``leave(token)`` after every call that
    runs eagerly (a graph compiler tracing through it sees ``fn`` alone)."""

    @functools.wraps(fn)
    def probed(*args: Any, **kwargs: Any) -> Any:
        if compiling():
            return fn(*args, **kwargs)
        token = enter(args, kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            leave(token)

    return probed
