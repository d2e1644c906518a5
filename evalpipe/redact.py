"""Credentials never reach what evalpipe writes or shows: one redaction for all of it.

run.json, manifests, reports, the history database and the worker's messages and logs
all pass config values, environments and URLs through here. Three rules:

- a value whose *name* looks like a credential (HF_TOKEN, *_API_KEY, hf_token,
  DB_PASSWORD, ...), or that a config names as one (``launch.api_key_env``), becomes
  ``***``, in mappings and as the argument of a ``--flag`` in command lists;
- in any string, a URL keeps its user but loses its password (``http://user:***@host``),
  and credential-named ``name=value`` pairs (``?token=``, ``HF_TOKEN=``, ``--api-key=``)
  and ``--api-key VALUE`` flags lose their values;
- nothing else changes, so a redacted run.json still reads (and re-renders) the same.

Standard library only: the worker imports this under any variant's interpreter.
The job.json a worker reads is the one file that keeps the real values (it is an
input, not a record).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"

# Credential-looking names (env vars, config keys, flags, query parameters). TOKENIZER,
# *_tokens (max_tokens, max_num_batched_tokens) and AUTHOR are not credentials; a
# variable that holds one under another name is passed in ``also``.
_SECRET_NAME = re.compile(
    r"TOKEN(?!IZ|S(?:[^A-Z]|$))|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|(?<![A-Z])PASS(?![A-Z])"
    r"|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|AUTH(?!OR)|(?<![A-Z])(?:SIG|SIGNATURE)(?![A-Z])",
    re.I,
)

# scheme://user:password@ -- the password runs to the last "@" before whitespace, so an
# unencoded "/" or "@" in it (which SQLAlchemy accepts) is hidden too.
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*):(?P<password>[^\s]+)@")
# name=value: an env assignment, a query parameter (?token=...), --api-key=...
_ASSIGNMENT = re.compile(r"(?<![\w.-])(?P<name>[\w.-]+)=(?P<value>[^\s&;#'\"<>]+)")
# --api-key VALUE in a command line written as text
_FLAG_VALUE = re.compile(r"(?<!\S)(?P<flag>--?[A-Za-z][\w-]*)(?P<space>\s+)(?P<value>[^\s-]\S*)")


def is_secret_name(name: Any) -> bool:
    return bool(_SECRET_NAME.search(str(name)))


def redact_text(text: Any) -> Any:
    """``text`` with URL passwords and the values of credential-named assignments, query
    parameters and flags hidden; anything that is not a string is returned as it is."""
    if not isinstance(text, str):
        return text
    if "://" in text:
        text = _USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)
    if "=" in text:
        text = _ASSIGNMENT.sub(lambda m: f"{m.group('name')}={REDACTED}" if is_secret_name(m.group("name")) else m.group(), text)
    if "-" in text:
        text = _FLAG_VALUE.sub(
            lambda m: f"{m.group('flag')}{m.group('space')}{REDACTED}" if is_secret_name(m.group("flag")) else m.group(), text)
    return text


def _names(also: Iterable[str | None]) -> frozenset[str]:
    return frozenset(n for n in also if n)


def _secret_key(key: Any, names: frozenset[str]) -> bool:
    k = str(key)
    # `launch.api_key_env` and its like hold a variable's name, not its value
    return k in names or (is_secret_name(k) and not k.lower().endswith("_env"))


def _hidden(value: Any) -> Any:
    # None, "" and booleans say whether something is set, not what it is
    return value if value is None or value == "" or isinstance(value, bool) else REDACTED


def _flag_name(item: str) -> str | None:
    return item.lstrip("-") if item.startswith("-") and len(item) > 1 else None


def _redact_list(items: list[Any], names: frozenset[str]) -> list[Any]:
    """A command line: the argument after a credential flag (``--api-key KEY``) and the
    value of ``--api-key=KEY`` hidden, every item redacted as usual."""
    out: list[Any] = []
    hide_next = False
    for item in items:
        if hide_next:
            out.append(_hidden(item))
            hide_next = False
            continue
        flag = _flag_name(item) if isinstance(item, str) else None
        if flag is not None and "=" in flag:
            name, _, value = flag.partition("=")
            if _secret_key(name, names):
                out.append(item[: len(item) - len(value)] + REDACTED)
                continue
        elif flag is not None and _secret_key(flag, names):
            hide_next = True
        out.append(redact(item, names))
    return out


def redact(value: Any, also: Iterable[str | None] = ()) -> Any:
    """A copy of ``value`` (JSON-like: mappings, lists, scalars) safe to write or show.

    ``also``: names whose values are credentials whatever they are called (a config's
    ``launch.api_key_env``)."""
    names = also if isinstance(also, frozenset) else _names(also)
    if isinstance(value, Mapping):
        return {k: _hidden(v) if _secret_key(k, names) else redact(v, names) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return _redact_list(list(value), names)
    return redact_text(value)


def redact_env(env: Mapping[str, str], also: Iterable[str | None] = ()) -> dict[str, str]:
    """An environment to record: credential values hidden (by name, by ``also``, and
    passwords in URL values such as HTTPS_PROXY=http://user:pw@proxy), sorted by name."""
    return redact({k: env[k] for k in sorted(env)}, also)


def api_key_names(launches: Iterable[Any]) -> list[str]:
    """The variables named by ``api_key_env`` of these launches (objects or dicts)."""
    out = set()
    for launch in launches:
        name = launch.get("api_key_env") if isinstance(launch, Mapping) else getattr(launch, "api_key_env", None)
        if name:
            out.add(str(name))
    return sorted(out)
