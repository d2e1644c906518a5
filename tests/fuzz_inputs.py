"""Mutated input for tests/test_input_fuzzer.py: every shipped config with one thing wrong
(a key dropped, duplicated, re-cased, renamed or retyped; a value swapped for a string, a
negative, an empty, a huge one, unicode, a path), realistic command lines with one thing
wrong, and the rules a command's answer must keep.

The rules, for any input: the exit code says accepted (0; `compare`'s verdicts 1 and 4)
or refused (2); a refusal is one sentence (:func:`refusal`) that names the key or option
it is about (:func:`names_any`); nothing appears under the output root or the history
location of a refused input, nor of a read command or a dry run (:func:`snapshot`). A
few mutations are always mistakes and must be refused (:attr:`Mutation.must_refuse`).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml
from hypothesis import strategies as st

from evalpipe.probes.resolve import kind_of

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

# Values a user (or an editor, or a template) puts where they do not belong.
STRINGS = ["x", " ", "ünïcødé", "名前", "\u202e", "😀", "a\nb", "builtin:nope", "builtin:", "null", "true", "1e999", "nan", "fp33",
           "a,b", "A=B", "$HOME", "%s", "[/]", "[bold]x"]
NEGATIVES = [-1, -0.5, -(10**30), "-1", "-0"]
EMPTIES = ["", [], {}, None]
HUGE = [10**30, 2**63, 1e308, math.inf, math.nan, "9" * 400, "x" * 5000]
PATHS = ["a/b", "../x", "..", ".", "./", "~", "~/x", "/proc/self/nope", "/dev/null", "a\\b", "C:\\x", "team/sp", "NUL"]
POOL: list[Any] = [*STRINGS, *NEGATIVES, *EMPTIES, *HUGE, *PATHS, True, False, 0, 1.5]
# Keys a name goes into: a variant's, an env variable's, a task group's.
BAD_NAMES = ["", "team/sp", "..", ".", "A=B", "a b", "ünï", "x" * 300, "-", "1", "legacy-aa", "~", "a\\b", "[/]"]


def text_values() -> st.SearchStrategy[str]:
    """Arbitrary text, except an absolute path (this runs as any user, root too: nothing may land outside the test's directory)."""
    return st.text(max_size=12).map(lambda s: s.lstrip("/~"))


def bad_values() -> st.SearchStrategy[Any]:
    return st.one_of(st.sampled_from(POOL), text_values(), st.integers(min_value=-(2**70), max_value=2**70),
                     st.floats(allow_nan=True, allow_infinity=True))


# ---------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------


# libyaml where PyYAML has it: the strategies parse the shipped files often
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=None)
def shipped_configs() -> list[str]:
    """Every config file under configs/, relative (configs/ascend/ too)."""
    return sorted(str(p.relative_to(CONFIGS)) for p in CONFIGS.rglob("*.yaml"))


@functools.lru_cache(maxsize=None)
def shipped_text(name: str) -> str:
    return (CONFIGS / name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def _parsed(name: str) -> Any:
    return yaml.load(shipped_text(name), Loader=_LOADER)


def parsed(name: str) -> Any:
    """A shipped file's YAML, a copy to change."""
    return copy.deepcopy(_parsed(name))


@functools.lru_cache(maxsize=None)
def extends_chain(name: str) -> list[str]:
    """``name`` and the files its ``extends:`` names, in order (relative to configs/)."""
    chain = [name]
    while True:
        data = _parsed(chain[-1])
        base = data.get("extends") if isinstance(data, dict) else None
        if not isinstance(base, str):
            return chain
        chain.append(str((CONFIGS / chain[-1]).parent.joinpath(base).resolve().relative_to(CONFIGS.resolve())))


@functools.lru_cache(maxsize=None)
def task_groups(name: str) -> list[str]:
    """The task groups `name` ends up with (its extends chain merged)."""
    groups: list[str] = []
    for part in extends_chain(name):
        data = _parsed(part) or {}
        groups += [g for g in (data.get("tasks") or {}) if g not in groups]
    return groups


Path_ = tuple[Any, ...]  # keys and list indexes from the top of a document


def _walk(node: Any, at: Path_ = ()) -> Iterator[Path_]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*at, k)
            yield from _walk(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield (*at, i)
            yield from _walk(v, (*at, i))


def _parent(doc: Any, path: Path_) -> Any:
    for p in path[:-1]:
        doc = doc[p]
    return doc


def _recase(key: str, how: str) -> str:
    return {"upper": key.upper(), "title": key.title(), "swap": key.swapcase(), "lower": key.lower()}[how]


# the last key of a value that names a file or directory: an empty one cannot mean anything
PATH_KEYS = {"path", "output", "python", "extends", "tokenizer", "history", "dashboard"}
# keys (of model:, engine: or env:) whose values come from a closed set none of POOL's strings belongs to
CLOSED_SET_KEYS = {"dtype": {"auto", "half", "float16", "bfloat16", "float", "float32"}, "EVALPIPE_LAYOUT": {"legacy", "sp"}}


@dataclass
class Mutation:
    """One change to one file of a config's extends chain; ``text`` is the changed file."""

    config: str  # the file given to -c (relative to configs/)
    target: str  # the file changed (the config or one it extends)
    kind: str
    path: Path_
    new: Any = None
    text: str = ""
    must_refuse: str | None = None  # why this input can only be a mistake
    anchors: list[str] = field(default_factory=list)  # words a refusal may name it by

    def describe(self) -> str:
        where = ".".join(str(p) for p in self.path) or "(top)"
        new = "" if self.new is None and self.kind in ("drop", "duplicate") else f" -> {self.new!r}"[:120]
        return f"{self.target}: {self.kind} {where}{new}"

    def as_json(self) -> dict[str, Any]:
        return {"config": self.config, "target": self.target, "kind": self.kind, "path": [str(p) for p in self.path],
                "new": repr(self.new)[:200]}


def _dump(doc: Any) -> str:
    return yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, allow_unicode=True, width=10_000)


def _anchors(path: Path_, *extra: Any) -> list[str]:
    words = [str(p) for p in path if isinstance(p, str)]
    for value in extra:
        text = value if isinstance(value, str) else repr(value) if not isinstance(value, (dict, list, type(None))) else ""
        if len(text.strip()) >= 3:
            words.append(text)
    return [w for w in words if w.strip()]


# Key lines of block YAML: `  name: value` or `  name:` (not list items, not comments).
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.@()-]*|\"[^\"]*\"):(?P<rest>\s.*|)$")
_FLOW_ITEM = re.compile(r"\{(?P<key>[A-Za-z_][\w.@-]*): (?P<value>[^,{}\[\]]+)(?P<sep>[,}])")


def duplicated_key_texts(text: str) -> list[tuple[str, str]]:
    """(key, the text with that key written twice in one mapping) for every key of ``text``:
    a block key's line (or its whole block) repeated, or a flow mapping's first entry."""
    lines = text.splitlines(keepends=True)
    out: list[tuple[str, str]] = []
    for i, line in enumerate(lines):
        m = _KEY_LINE.match(line.rstrip("\n"))
        if m is None:
            flow = _FLOW_ITEM.search(line)
            if flow and not line.lstrip().startswith("#"):
                item = f"{flow['key']}: {flow['value']}"
                out.append((flow["key"], "".join(lines[:i]) + line.replace(item, f"{item}, {item}", 1) + "".join(lines[i + 1:])))
            continue
        indent = len(m["indent"])
        end = i + 1
        if not m["rest"].split("#")[0].strip():  # a block: its more-indented lines (and blank/comment lines inside) go along
            while end < len(lines) and (not lines[end].strip() or lines[end].lstrip().startswith("#")
                                        or len(lines[end]) - len(lines[end].lstrip(" ")) > indent
                                        or (lines[end].lstrip().startswith("- ") and len(lines[end]) - len(lines[end].lstrip(" ")) == indent)):
                end += 1
        block = "".join(lines[i:end])
        block = block if block.endswith("\n") else block + "\n"
        out.append((m["key"].strip('"'), "".join(lines[:end]) + ("" if "".join(lines[:end]).endswith("\n") else "\n") + block + "".join(lines[end:])))
    return out


def duplicate_keys(text: str) -> list[str]:
    """The keys some mapping of ``text`` holds twice (YAML forbids it; PyYAML keeps the last)."""
    dups = []
    stack = [yaml.compose(text, Loader=_LOADER)]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            dups += sorted({k for k in keys if keys.count(k) > 1})
            stack += [v for _, v in node.value]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
    return dups


@functools.lru_cache(maxsize=None)
def _written_twice(target: str) -> list[tuple[str, str]]:
    """duplicated_key_texts of a shipped file, those that really hold a key twice."""
    return [(key, dup) for key, dup in duplicated_key_texts(shipped_text(target)) if duplicate_keys(dup) == [key]]


@st.composite
def config_mutations(draw: st.DrawFn) -> Mutation:
    """One shipped config (any file under configs/) with one thing wrong in it or in a file it extends."""
    config = draw(st.sampled_from(shipped_configs()))
    target = draw(st.sampled_from(extends_chain(config)))
    kind = draw(st.sampled_from(["drop", "duplicate", "recase", "rename", "retype_key", "retype_value", "swap_value"]))
    if kind == "duplicate":
        key, changed = draw(st.sampled_from(_written_twice(target)))
        return Mutation(config, target, kind, (key,), text=changed, must_refuse=f"`{key}` is written twice in one mapping",
                        anchors=[key])
    doc = parsed(target)
    paths = list(_walk(doc))
    if kind in ("recase", "rename", "retype_key"):
        paths = [p for p in paths if isinstance(p[-1], str)]
    path = draw(st.sampled_from(paths))
    parent = _parent(doc, path)
    last = path[-1]
    old = parent[last]
    must = None
    new: Any = None
    if kind == "drop":
        del parent[last]
        anchors = _anchors(path)
    elif kind in ("recase", "rename", "retype_key"):
        if kind == "recase":
            new = _recase(last, draw(st.sampled_from(["upper", "title", "swap"])))
        elif kind == "rename":
            new = draw(st.sampled_from(BAD_NAMES))
        else:
            new = draw(st.sampled_from([1, 1.5, True, None]))
        if new == last or new in parent:
            new = f"{new}_"  # another key, not the same one (a key written twice is `duplicate`'s)
        items = [(new if k == last else k, v) for k, v in parent.items()]
        parent.clear()
        parent.update(items)
        if kind == "rename" and len(path) >= 2 and path[-2] == "env" and ("=" in str(new) or new == ""):
            must = f"environment variable name {new!r}"
        if kind == "rename" and len(path) == 2 and path[0] == "variants" and (
                new in ("", ".", "..", "~") or "/" in str(new) or "\\" in str(new)):
            must = f"variant name {new!r} cannot name its directory"
        anchors = _anchors(path, new)
    else:
        if kind == "retype_value":
            options = [[old], {"x": old}, None, 1, True, 1.5, "x"]
            new = draw(st.sampled_from([o for o in options if type(o) is not type(old)]))
        else:
            new = draw(bad_values())
        parent[last] = new
        if new == "" and last in PATH_KEYS:
            must = f"`{last}` is empty"
        if (last in CLOSED_SET_KEYS and len(path) >= 2 and path[-2] in ("model", "engine", "env") and isinstance(new, str)
                and new not in CLOSED_SET_KEYS[last]):
            must = f"`{last}: {new}` is none of {', '.join(sorted(CLOSED_SET_KEYS[last]))}"
        anchors = _anchors(path, new)
    return Mutation(config, target, kind, path, new, _dump(doc), must, anchors)


# ---------------------------------------------------------------------------
# What the commands ask a variant's interpreter, answered without starting one
# ---------------------------------------------------------------------------


def _shipped_documents() -> Iterator[dict[str, Any]]:
    for name in shipped_configs():
        data = _parsed(name)
        if isinstance(data, dict):
            yield data


def shipped_engine_args() -> set[str]:
    """Every engine argument a shipped config sets, and what evalpipe adds itself."""
    names = {"model", "dtype", "tokenizer"}
    for data in _shipped_documents():
        names |= set(data.get("engine") or {})
        names |= set((data.get("noise_floor") or {}).get("engine") or {} if isinstance(data.get("noise_floor"), dict) else {})
        for variant in (data.get("variants") or {}).values():
            names |= set((variant or {}).get("engine") or {})
    return names


def shipped_probe_names() -> dict[str, str]:
    """name -> kind ("class" or the lookup's own kind) of every probed name a shipped config
    uses whose package this interpreter has (vllm_ascend's are missing here, as for real)."""
    found: dict[str, str] = {}
    for data in _shipped_documents():
        expects = [data.get("expect") or {}] + [(v or {}).get("expect") or {} for v in (data.get("variants") or {}).values()]
        for expect in expects:
            for key in ("model", "layers", "called", "not_called", "per_forward", "switches"):
                value = expect.get(key)
                names = [value] if isinstance(value, str) else list(value or [])
                for name in names:
                    top = name.split(".", 1)[0]
                    if "." in name and importlib.util.find_spec(top) is not None:
                        found[name] = "class" if key in ("model", "layers") else kind_of(name)
    return found


# ---------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------


def refusal(stderr: str) -> tuple[str | None, str]:
    """(the refusal's sentence, who said it) when ``stderr`` is one: evalpipe's single
    line `error: ...` and nothing else ("evalpipe"), or the command line's usage error:
    its Usage and Try lines and one message in the box ("usage"); else (None, what is
    wrong with it)."""
    lines = [ln for ln in stderr.split("\n") if ln.strip()]  # line feeds only: what a terminal breaks lines at
    errors = [ln for ln in lines if ln.startswith("error:")]
    if errors:
        if len(lines) != 1:
            return None, f"{len(lines)} lines on stderr around the error: {lines[:4]!r}"
        sentence = errors[0].removeprefix("error:").strip()
        return (sentence, "evalpipe") if sentence else (None, "an empty error")
    box = [ln for ln in lines if ln.startswith("│")]
    if box and any(ln.startswith("╭─ Error") for ln in lines):
        others = [ln for ln in lines if not ln.startswith(("Usage:", "Try '", "╭", "╰", "│"))]
        if others:
            return None, f"usage error with more around it: {others[:3]!r}"
        return " ".join(ln.strip("│ ") for ln in box), "usage"
    return None, f"no error sentence on stderr: {lines[:3]!r}"


def _word(anchor: str, text: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(anchor) + r"(?![\w])", text) is not None


def names_any(sentence: str, anchors: list[str], files: list[str] = ()) -> bool:  # type: ignore[assignment]
    """The sentence names one of ``anchors`` (as a word), or a file of ``files`` and a `key`."""
    flat = " ".join(sentence.split())
    if any(_word(" ".join(a.split()), flat) for a in anchors if a.strip()):
        return True
    return any(f in flat for f in files) and re.search(r"`[^`]+`", flat) is not None


def snapshot(root: Path) -> dict[str, int]:
    """Every file (with its mtime) and directory under ``root``, but run directories' lock
    files (and so the mtime of the directory a lock file went into)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in dirnames + filenames:
            p = here / name
            if name == ".lock":
                continue
            try:
                out[str(p.relative_to(root))] = 0 if name in dirnames else p.lstat().st_mtime_ns
            except OSError:
                pass
    return out


def changed(before: dict[str, int], after: dict[str, int]) -> list[str]:
    return sorted(k for k in after if before.get(k) != after[k])


def record(path: str, entry: dict[str, Any]) -> None:
    """Append one failing example to the collection file (EVALPIPE_FUZZ_COLLECT)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False, default=repr) + "\n")
