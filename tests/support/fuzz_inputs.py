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
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml
from checkout import ROOT
from hypothesis import strategies as st

from evalpipe.probes.resolve import kind_of

CONFIGS = ROOT / "configs"

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


# ---------------------------------------------------------------------------
# Blocks: a config's `localize:` and `expect:`, a --gates file. Each is built from
# good parts (must be accepted when all are good) and bad ones (must be refused), and
# parts of a known gap: a rule evalpipe does not enforce yet, neither asserted (listed
# in KNOWN_GAPS with what it is waiting for; removing an entry turns its cases into
# must-refuse ones).
# ---------------------------------------------------------------------------

# gap -> why it is not enforced yet; removing an entry turns its cases into must-refuse ones.
# The rules once listed here are in place (their tags stay on their cases: negative-count,
# unordered-range, bool-as-count, unfailable-threshold, nan-threshold, top-level-expect-shadowed).
KNOWN_GAPS: dict[str, str] = {}


@dataclass
class Block:
    """One generated block; ``doc`` its YAML document."""

    doc: Any
    parts: list[str] = field(default_factory=list)  # what was put in, for the report
    anchors: list[str] = field(default_factory=list)
    reasons: list[tuple[str, str, str | None]] = field(default_factory=list)  # (key, why bad, its gap) of each bad part

    def bad(self, why: str, gap: str | None = None, key: str = "") -> None:
        """A part that must be refused (or, when ``gap`` is still in KNOWN_GAPS, is not yet)."""
        self.reasons.append((key, why, gap))

    @property
    def gaps(self) -> list[str]:
        out = [gap for key, _, gap in self.reasons if gap is not None and gap in KNOWN_GAPS]
        return out

    @property
    def must_refuse(self) -> str | None:
        return next((why for key, why, gap in self.reasons if gap is None or gap not in KNOWN_GAPS), None)

    @property
    def must_accept(self) -> bool:
        return not self.reasons

    def describe(self) -> str:
        return "; ".join(self.parts) + (f" [known gaps: {', '.join(self.gaps)}]" if self.gaps else "")


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc.setdefault(key, {})
    doc[path[-1]] = value


def _leaves(model: type, at: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """(path, field) of every field of ``model`` that holds a value (nested models walked into)."""
    from pydantic import BaseModel

    out = []
    for name, info in model.model_fields.items():  # type: ignore[attr-defined]
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _leaves(ann, (*at, name))
        else:
            out.append(((*at, name), info))
    return out


def _bounds(info: Any) -> tuple[float | None, bool, float | None, bool]:
    lower = upper = None
    lower_in = upper_in = True
    for m in info.metadata:
        for attr, is_lower, inclusive in (("ge", True, True), ("gt", True, False), ("le", False, True), ("lt", False, False)):
            if hasattr(m, attr):
                if is_lower:
                    lower, lower_in = getattr(m, attr), inclusive
                else:
                    upper, upper_in = getattr(m, attr), inclusive
    return lower, lower_in, upper, upper_in


def _kinds(info: Any) -> set[Any]:
    """The plain types (and Literal values) a field takes."""
    args = typing.get_args(info.annotation) if typing.get_origin(info.annotation) in (typing.Union, types.UnionType) else (info.annotation,)
    out: set[Any] = set()
    for a in args:
        if typing.get_origin(a) is typing.Literal:
            out |= {("literal", v) for v in typing.get_args(a)}
        else:
            out.add(a)
    return out


@st.composite
def field_part(draw: st.DrawFn, block: Block, path: tuple[str, ...], info: Any, *, threshold: bool) -> Any:
    """A value for one field, good or bad; ``block`` learns which. ``threshold``: a gate's
    number (a margin, a floor, a multiple), where inf and nan make the gate unfailable."""
    kinds = _kinds(info)
    lower, lower_in, upper, upper_in = _bounds(info)
    name = ".".join(path)
    literals = [v for k in kinds if isinstance(k, tuple) for v in [k[1]]]
    numeric = int if int in kinds else float if float in kinds else None
    good = draw(st.booleans())
    if bool in kinds:
        if good:
            return draw(st.booleans())
        value = draw(st.sampled_from(["maybe", [True], {"x": 1}, 2]))
        block.bad(f"`{name}: {value!r}` is not true or false")
        return value
    if numeric is None:  # a closed set of words
        if good and literals:
            return draw(st.sampled_from(literals))
        value = draw(st.sampled_from(["x", "", 7, [1]]))
        block.bad(f"`{name}: {value!r}` is none of {literals}")
        return value
    if good:
        choices: list[Any] = list(literals)
        low = lower if lower is not None else 0
        top = upper if upper is not None else max(low, 0) + (1 if numeric is float else 8)
        if numeric is int:
            choices += sorted({int(low) + (0 if lower_in else 1), int(top) - (0 if upper_in else 1)})
        else:
            top = min(top, 0.9) if threshold else top  # a margin of 1 or more can never fail on a 0/1 metric
            choices += [low + (top - low) * f for f in (0.1, 0.5, 0.9)]
        if type(None) in kinds:
            choices.append(None)
        return draw(st.sampled_from(choices))
    bad: list[Any] = ["wide", [1], {"x": 1}]
    if lower is not None:
        bad.append(lower - 1 if lower_in else lower)
    if upper is not None:
        bad.append(upper + 1 if upper_in else upper)
    if numeric is int:
        bad.append(1.5)
    if threshold and path[-1] == "margin":
        bad.append(1.0)  # a difference of a whole 0/1 metric: no score difference exceeds it
    bad += [True, math.inf, math.nan]
    value = draw(st.sampled_from(bad))
    if value is True:
        block.bad(f"`{name}: true` where a number is wanted")
    elif isinstance(value, float) and math.isnan(value):
        if lower is None and upper is None:
            block.bad(f"`{name}: nan`", "nan-threshold" if threshold else None)
        else:
            block.bad(f"`{name}: nan` is outside its bounds")
    elif value == 1.0 and path[-1] == "margin":
        block.bad(f"`{name}: 1` makes the score gate unfailable on a 0/1 metric", "unfailable-threshold")
    elif value == math.inf:
        if upper is not None:
            block.bad(f"`{name}: inf` is above {upper}")
        elif threshold:
            block.bad(f"`{name}: inf` makes the gate unfailable", "unfailable-threshold")
        else:
            block.bad(f"`{name}: inf` is no finite setting")
    else:
        block.bad(f"`{name}: {value!r}` is not a number within its bounds")
    return value


@st.composite
def model_blocks(draw: st.DrawFn, model: type, *, threshold: bool = False, skip: tuple[str, ...] = ()) -> Block:
    """A block of ``model``'s keys: one to three fields set, good or bad, or an unknown key."""
    block = Block({})
    leaves = [(p, info) for p, info in _leaves(model) if not set(p) & set(skip)]
    for path, info in draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=3, unique_by=lambda x: x[0])):
        value = draw(field_part(block, path, info, threshold=threshold))
        _set(block.doc, path, value)
        block.parts.append(f"{'.'.join(path)}: {value!r}")
        block.anchors += [p for p in path] + [".".join(path)]
    if draw(st.integers(0, 4)) == 0:
        path = draw(st.sampled_from(leaves))[0]
        typo = (*path[:-1], path[-1].upper() if draw(st.booleans()) else path[-1][:-1] + "x")
        _set(block.doc, typo, 1)
        block.parts.append(f"unknown key {'.'.join(typo)}")
        block.anchors += [typo[-1], ".".join(typo)]
        block.bad(f"unknown key `{'.'.join(typo)}`")
    return block


def _shipped_names(kind: str) -> list[str]:
    return sorted(n for n, k in shipped_probe_names().items() if (k == "class") == (kind == "class") and not n.endswith("()"))


SHIPPED_COLLECTIVES = ["all_gather", "reduce_scatter", "all_to_all"]  # what the layout model's probes record


@st.composite
def expect_blocks(draw: st.DrawFn) -> Block:
    """An `expect:` block: each key good (names the shipped configs use, counts, ordered
    ranges) or bad (names that are no dotted name, unknown ones, wrong types, negative
    counts, unordered ranges, `true` for a count, unknown keys)."""
    block = Block({})
    classes, functions = _shipped_names("class"), _shipped_names("function")
    keys = draw(st.lists(st.sampled_from(["same_path", "model", "engine_processes", "layers", "called", "not_called",
                                          "per_forward", "forward_tokens", "switches", "unknown"]), min_size=1, max_size=3,
                             unique=True))
    for key in keys:
        good = draw(st.booleans())
        value: Any
        if key == "same_path":
            value = draw(st.booleans()) if good else draw(st.sampled_from(["maybe", [True], 2]))
            good or block.bad(f"`same_path: {value!r}` is not true or false")
        elif key == "model":
            value = draw(st.sampled_from(classes)) if good else draw(st.sampled_from(
                ["LayoutForCausalLM", "evalpipe.lab.layout.model.NoSuchModel", "nosuch.module.Class", 3, "a..b", "x.y()"]))
            good or block.bad(f"`model: {value!r}` names no class of the variant's interpreter")
        elif key == "engine_processes":
            value = draw(st.sampled_from([1, 2, 4])) if good else draw(st.sampled_from([0, -1, 1.5, "two", True]))
            if not good:
                block.bad(f"`engine_processes: {value!r}` is not a count of at least 1")
        elif key in ("layers", "called", "not_called"):
            pool = classes if key == "layers" else functions
            if good:
                value = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True))
            else:
                value = draw(st.sampled_from([["attention"], ["evalpipe.lab.layout.model.nope"], ["nosuch.module.fn"],
                                              "evalpipe.lab.layout.model.LayoutDecoderLayer._nope", [3], {"x": 1}, ["a b.c"]]))
                block.bad(f"`{key}: {value!r}` names no function of the variant's interpreter")
        elif key == "per_forward":
            value = {}
            for name in draw(st.lists(st.sampled_from([*SHIPPED_COLLECTIVES, *functions]), min_size=1, max_size=3, unique=True)):
                count: Any
                if good:
                    count = draw(st.one_of(st.integers(0, 6), st.builds(lambda a, b: {"min": a, "max": a + b}, st.integers(0, 3), st.integers(0, 3))))
                else:
                    bad = draw(st.sampled_from(["count", "name"]))
                    if bad == "name":
                        name = draw(st.sampled_from(["all_gathr", "allgather", "all_gather@", "all_gather@t p", "x"]))
                        count = 0
                        block.bad(f"`per_forward` key {name!r} is no collective kind nor a dotted function name")
                    else:
                        count = draw(st.sampled_from([-1, -3, True, 1.5, "three", {"min": 3, "max": 1}, {"min": -1}, {"mn": 1}]))
                        if count is True:
                            block.bad(f"`per_forward.{name}: true`", "bool-as-count")
                        elif count in (-1, -3):
                            block.bad(f"`per_forward.{name}: {count}` is a negative count", "negative-count")
                        elif count == {"min": 3, "max": 1}:
                            block.bad(f"`per_forward.{name}: {count}` has its minimum above its maximum", "unordered-range")
                        else:
                            block.bad(f"`per_forward.{name}: {count!r}` is not a count nor a {{min, max}} range")
                value[name] = count
                block.anchors.append(name)
        elif key == "forward_tokens":
            if good:
                value = {draw(st.sampled_from(["1", 2, "64", 8192])): draw(st.sampled_from([{"min": 1}, {"max": 0}, {"min": 0, "max": 5}]))}
            else:
                value = draw(st.sampled_from([{"3": {"min": 1}}, {"0": {"min": 1}}, {"one": {"min": 1}}, {"1": 2},
                                              {"1": {"min": 2, "max": 1}}, {"1": {"min": True}}, {"1": {}}, [1]]))
                block.bad(f"`forward_tokens: {value!r}` is not a power-of-two bin with a range of passes")
        elif key == "switches":
            value = draw(st.sampled_from([{"tensor_parallel_size": 1}, {"dtype": "float32"}])) if good else draw(
                st.sampled_from([{"bogus": 1}, {"tensor parallel size": 1}, [1], "x"]))
            good or block.bad(f"`switches: {value!r}` holds no switch the probes read")
        else:
            key, value = draw(st.sampled_from(["calld", "Called", "per_forwards", "expect"])), []
            block.bad(f"unknown key `{key}`")
        block.doc[key] = value
        block.parts.append(f"{key}: {value!r}")
        block.anchors.append(key)
        block.reasons = [(key if not k else k, why, gap) for k, why, gap in block.reasons]
    return block



def with_block(config: str, where: tuple[str, ...], block: Block) -> str:
    """The shipped ``config`` with ``block`` at ``where`` (its keys merged over what is there)."""
    doc = parsed(config)
    target = doc
    for key in where[:-1]:
        target = target.setdefault(key, {})
    old = target.get(where[-1])
    if isinstance(old, dict) and isinstance(block.doc, dict):
        target[where[-1]] = {**old, **block.doc}
    else:
        target[where[-1]] = block.doc
    return _dump(doc)


def gates_file(block: Block, wrapped: bool) -> str:
    return _dump({"gates": block.doc} if wrapped else block.doc)


# Options that set the same quantity as a config key: (model, field) of the key
BOUNDED_OPTIONS = {"--positions": ("Localize", "positions"), "--samples": ("Localize", "samples"),
                   "--decode-steps": ("Localize", "decode_steps"), "--limit": ("TaskSpec", "limit"),
                   "--stall-timeout": ("LaunchFields", "stall_timeout_s"), "--margin": ("ScoreGates", "margin")}
# bounds a field's own validator holds (not its metadata): (lower, included, upper, included)
VALIDATED_BOUNDS = {"--margin": (0, False, 1, False)}  # a margin of 1 or more no 0/1 score difference exceeds


def outside_bounds(option: str, value: str) -> str | None:
    """Why ``value`` of a bounded option can only be a mistake (outside its key's bounds), else None."""
    from evalpipe.config import gate_settings, run_config

    if option not in BOUNDED_OPTIONS:
        return None
    model, name = BOUNDED_OPTIONS[option]
    info = (getattr(run_config, model, None) or getattr(gate_settings, model)).model_fields[name]
    try:
        number = int(value) if int in _kinds(info) else float(value)
    except ValueError:
        return None  # not a number: the command line's parser says so
    lower, lower_in, upper, upper_in = VALIDATED_BOUNDS.get(option) or _bounds(info)
    if math.isnan(number) or (lower is not None and (number < lower if lower_in else number <= lower)) or (
            upper is not None and (number > upper if upper_in else number >= upper)):
        return f"{option} {value} is outside the bounds of its config key"
    return None


# ---------------------------------------------------------------------------
# The cluster and sampling surfaces: `cluster:`, `sampling:` (the run's and a task's),
# --cluster and its companions, the local cluster's command line, doctor --cluster
# ---------------------------------------------------------------------------

GOOD_ADDRESSES = ["auto", "10.0.0.1:6379", "ray://head:10001", "[::1]:6379", "head.example:1"]
# each with why it is wrong: the refusal must say what is wrong with the address, not "start the cluster"
BAD_ADDRESSES = {"": "is empty", " ": "is empty", "local": "would start a private one-node Ray cluster",
                 "http://10.0.0.1:8265": "has the scheme http://", "ray://head": "names no port",
                 "head": "names no port", "head:x": "which is not a number", "head:0": "out of range",
                 "head:70000": "out of range", "head:6379/x": "holds a path", "a b:1": "holds a space"}
GOOD_RESOURCES = [{"CPU": 1}, {"NPU": 16, "CPU": 1}, {"node_a": 0.5}, {"CPU": 0, "NPU": 8}]
BAD_RESOURCES = [{}, {"CPU": 0}, {"CPU": 0, "NPU": 0.0}, {"CPU": -1}, {"CPU": True}, {"CPU": "one"}, {" ": 1}, [["CPU", 1]],
                 {"CPU": math.inf}]


@st.composite
def address_part(draw: st.DrawFn, block: Block, name: str) -> Any:
    if draw(st.booleans()):
        return draw(st.sampled_from(GOOD_ADDRESSES))
    value = draw(st.sampled_from([*BAD_ADDRESSES, True, 7, ["auto"]]))
    block.bad(f"`{name}: {value!r}` is not a Ray address")
    return value


@st.composite
def cluster_blocks(draw: st.DrawFn) -> Block:
    """A `cluster:` block: an address (good or bad) and some of its other keys, good or bad,
    with the rule that binds two of them (`distinct_nodes` places all at once)."""
    from evalpipe.config.cluster import ClusterSettings

    block = Block({}, anchors=["cluster"])
    fields = ClusterSettings.model_fields
    chosen = draw(st.lists(st.sampled_from(["resources", "concurrency", "distinct_nodes", "placement_timeout_s",
                                            "shared_filesystem", "scratch"]), max_size=3, unique=True))
    for key in ["address", *chosen]:
        if key == "address":
            value = draw(address_part(block, "cluster.address"))
        elif key == "resources":
            good = draw(st.booleans())
            value = draw(st.sampled_from(GOOD_RESOURCES if good else BAD_RESOURCES))
            if not good:
                block.bad(f"`cluster.resources: {value!r}` is no bundle Ray places")
        elif key == "scratch":
            value = draw(st.sampled_from(["/tmp/evalpipe-x", "scratch", ""]))
            if value == "":
                block.bad("`cluster.scratch` is empty")
        else:
            value = draw(field_part(block, ("cluster", key), fields[key], threshold=False))
        block.doc[key] = value
        block.parts.append(f"cluster.{key}: {value!r}")
        block.anchors += [key, f"cluster.{key}"]
    if block.doc.get("distinct_nodes") is True and isinstance(block.doc.get("concurrency"), int) \
            and not isinstance(block.doc.get("concurrency"), bool):
        block.bad("`distinct_nodes` with `concurrency`: one cannot limit the other")
    return block


@st.composite
def sampling_blocks(draw: st.DrawFn) -> Block:
    """A `sampling:` block (the run's or a task's): its keys good or bad, a temperature
    always (it has no default), at times one where vLLM decodes greedily."""
    from evalpipe.config.sampling import GREEDY_BELOW, Sampling

    block = draw(model_blocks(Sampling))
    block.anchors += ["sampling"]
    if "temperature" not in block.doc:
        greedy = draw(st.integers(0, 4)) == 0
        block.doc["temperature"] = draw(st.sampled_from([0, 0.0, GREEDY_BELOW / 10])) if greedy else 0.6
        block.parts.append(f"temperature: {block.doc['temperature']!r}")
        block.anchors += ["temperature", "sampling.temperature"]
        if greedy:
            block.bad("a temperature where vLLM decodes greedily")
    return block


def jsonl_problems(stdout: str, exit_code: int) -> list[str]:
    """What breaks the --progress jsonl contract: every stdout line a JSON object with an
    `event`, the last of them the one verdict, with the command's exit code."""
    events = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            return [f"a line on stdout that is not JSON: {line[:120]!r}"]
        if not isinstance(event, dict) or "event" not in event:
            return [f"a JSON line that is no event: {line[:120]!r}"]
        events.append(event)
    verdicts = [e for e in events if e["event"] == "verdict"]
    if not events or events[-1]["event"] != "verdict":
        return ["stdout does not end in a verdict event"]
    if len(verdicts) != 1:
        return [f"{len(verdicts)} verdict events"]
    if verdicts[0]["exit_code"] != exit_code:
        return [f"the verdict says exit {verdicts[0]['exit_code']}, the command exited {exit_code}"]
    return []


@st.composite
def requires_blocks(draw: st.DrawFn) -> Block:
    """A task's `requires:`: counters good or bad, vLLM's step buckets or none of them."""
    block = Block({})
    block.anchors += ["requires"]
    good_ranges = [{"min": 1}, {"max": 0}, {"min": 0, "max": 5}]
    bad_ranges = [{}, {"min": 0}, {"min": 2, "max": 1}, {"min": True}, 1, "many", [1]]
    for key in draw(st.lists(st.sampled_from(["prefix_cache_hits", "preemptions", "spec_decode_accepted_tokens",
                                              "steps_by_tokens", "prefix_cache_hit"]), min_size=0, max_size=2, unique=True)):
        good = draw(st.booleans())
        value: Any
        if key == "prefix_cache_hit":
            value = {"min": 1}
            block.bad("unknown key `prefix_cache_hit`")
        elif key == "steps_by_tokens":
            bucket = draw(st.sampled_from(["1", 8, "512"] if good else ["3", "0", "two", True]))
            value = {bucket: draw(st.sampled_from(good_ranges))}
            good or block.bad(f"`steps_by_tokens: {value!r}` names no bucket of vLLM's")
        else:
            value = draw(st.sampled_from(good_ranges if good else bad_ranges))
            good or block.bad(f"`{key}: {value!r}` is no range of counts")
        block.doc[key] = value
        block.parts.append(f"requires.{key}: {value!r}")
        block.anchors += [key, f"requires.{key}"]
    if not block.doc:
        block.parts.append("requires: {}")
        block.bad("`requires: {}` requires nothing")
    return block
