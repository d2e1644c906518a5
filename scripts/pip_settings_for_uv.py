"""The machine's pip settings as uv command-line arguments, one per line (scripts/setup.sh).

uv reads no pip configuration: where pip is told of extra indexes, a folder of wheels or a
constraints file (its config files or PIP_* variables), uv would resolve without them and
could pick other builds (a CUDA torch where the machine's wheel folder holds the CPU one).
pip's own `pip config list` says what pip would use; each setting becomes uv's flag of the
same meaning. `--cert` prints the certificate bundle pip uses instead (uv takes it from
SSL_CERT_FILE).

    python scripts/pip_settings_for_uv.py          # --index-url ... --find-links ... lines
    python scripts/pip_settings_for_uv.py --cert   # a path, or nothing
"""

from __future__ import annotations

import ast
import subprocess
import sys

# pip's setting -> uv's flag of the same meaning
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}


# which origin of a setting pip obeys for `pip install`: its PIP_* variables over the
# [install] section of its files over their [global] one
PRECEDENCE = {"global": 0, "install": 1, ":env:": 2}


def settings(listing: str) -> dict[str, list[str]]:
    """`pip config list` output (``origin.name='value'`` lines, sorted by name) as the values
    of each setting pip obeys when it installs; several values in one are space-separated."""
    found: dict[str, tuple[int, list[str]]] = {}
    for line in listing.splitlines():
        key, sep, quoted = line.partition("=")
        origin, dot, name = key.rpartition(".")
        if not sep or not dot or origin not in PRECEDENCE:
            continue
        rank = PRECEDENCE[origin]
        if name not in found or rank >= found[name][0]:
            found[name] = (rank, str(ast.literal_eval(quoted)).split())
    return {name: values for name, (_, values) in found.items()}


def uv_arguments(found: dict[str, list[str]]) -> list[str]:
    args: list[str] = []
    for name, flag in FLAGS.items():
        for value in found.get(name, []):
            args += [flag, value]
    return args


def main(argv: list[str]) -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    found = settings(listing)
    lines = found.get("cert", [])[:1] if argv[1:] == ["--cert"] else uv_arguments(found)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
