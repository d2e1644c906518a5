"""Engine arguments as vLLM command-line flags, as vLLM itself turns a ``--config`` file
into flags (vllm/utils/argparse_utils.py, ``FlexibleArgumentParser.load_config_file``):
``key: true`` is ``--key``, ``key: false`` is ``--no-key``, a list is the flag followed by
its items, a mapping is one JSON word, anything else its text.

A deployment's nodes get their arguments this way rather than in a file: a file written
here is not on another node, and the flags are what a person compares with the command
lines their own launch scripts run.
"""

from __future__ import annotations

import json
import shlex
from typing import Any


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def as_flags(args: dict[str, Any]) -> list[str]:
    """``args`` (engine argument names as a config writes them) as argv words, in order."""
    words: list[str] = []
    for key, value in args.items():
        name = flag_name(key)
        if value is True:
            words.append(name)
        elif value is False:
            words.append("--no-" + name[2:])
        elif value is None:
            continue  # vLLM's default: a config that writes `key: null` asks for nothing
        elif isinstance(value, dict):
            words += [name, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            if not value:
                continue  # as vLLM: an empty list says nothing
            words += [name, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)]
        else:
            words += [name, str(value)]
    return words


def shell_line(argv: list[str]) -> str:
    """``argv`` as one line a shell runs as the same words."""
    return " ".join(shlex.quote(word) for word in argv)
