"""YAML as evalpipe reads it: what the text says, or one sentence why not.

PyYAML's safe loader lets a second `engine:` later in a file silently replace the first,
and expands aliases without bound (a "billion laughs" file of a few lines becomes
hundreds of thousands of nodes). Both are refused here, for every YAML file evalpipe
reads from a user: run configs (with their `extends:` chain) and gates files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from evalpipe.config.errors import ConfigError

# A run config is a few hundred nodes; anchors and aliases that reuse a variant's block a
# few times stay far below this. An alias bomb passes it after a few levels.
MAX_EXPANDED_NODES = 20_000

_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlRefused(ConfigError):
    """The file is YAML, but not YAML evalpipe accepts (a duplicate key, an alias bomb)."""


class _StrictLoader(yaml.SafeLoader):
    source = "<yaml>"

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *base` then an explicit key overrides on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
                seen[key] = key_node.start_mark.line
            except TypeError:  # an unhashable key: the base class says what is wrong with it
                continue
            if first is not None:
                raise YamlRefused(
                    f"{self.source}: key `{key}` appears twice in one mapping (lines {first + 1} and "
                    f"{key_node.start_mark.line + 1}); the second would silently replace the first, so merge them into one."
                )
        return super().construct_mapping(node, deep=deep)

    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node, self.source)
        return node


def _check_expansion(root: Node, source: str) -> None:
    """Refuse a document whose aliases expand to more than MAX_EXPANDED_NODES nodes."""
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in in_progress:  # an alias inside its own anchor: infinite once expanded
            raise YamlRefused(f"{source}: an alias refers to the block that contains it (an endless structure); remove that alias.")
        in_progress.add(key)
        if isinstance(node, MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, SequenceNode):
            total = 1 + sum(size(item) for item in node.value)
        else:
            total = 1
        in_progress.discard(key)
        sizes[key] = min(total, MAX_EXPANDED_NODES + 1)
        return sizes[key]

    if size(root) > MAX_EXPANDED_NODES:
        raise YamlRefused(
            f"{source}: its aliases (`*name`) expand to more than {MAX_EXPANDED_NODES} nodes, far more than a config "
            "needs; write the repeated blocks out or reuse fewer of them."
        )


def load_yaml_text(text: str, source: str) -> Any:
    """The YAML document in ``text``; YamlRefused for a duplicate key or an alias bomb,
    yaml.YAMLError for bad syntax (the caller says where)."""
    loader_class = type("_Loader", (_StrictLoader,), {"source": source})
    loader = loader_class(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml_file(path: Path, label: str, fix: str) -> Any:
    """The YAML document in the file at ``path``; ``label`` names the file in messages
    ("config file PATH", "gates file PATH") and ``fix`` says how to pass another one."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise YamlRefused(f"{label} is not UTF-8 text (byte {err.start} cannot be decoded); {fix}.") from None
    except OSError as err:
        raise YamlRefused(f"{label} cannot be read ({err.strerror or err}); {fix}.") from None
    try:
        return load_yaml_text(text, str(path))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise YamlRefused(f"{path}: invalid YAML{at}: {getattr(err, 'problem', None) or err}; fix the syntax.") from None
