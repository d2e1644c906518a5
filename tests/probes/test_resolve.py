"""evalpipe/probes/resolve.py, the lookup that runs in a variant's own interpreter before it
starts: what kind a probed name is, the function or method it names where it is defined
(a re-exported function under its home module, a method under its class), and one clause
saying why a name cannot be probed (a module, a property, a missing attribute)."""

from __future__ import annotations

import json
import subprocess
import sys

from evalpipe.probes.resolve import MARK, kind_of, resolve_callable, resolve_names


def test_what_kind_a_probed_name_is():
    assert kind_of("parallel_config.use_sequence_parallel_moe") == "config"
    assert kind_of("additional_config.layout") == "config"
    assert kind_of("evalpipe.engine_patches.plugin.installed()") == "predicate"
    assert kind_of("json.decoder.JSONDecoder.decode") == "function"


def test_a_callable_is_named_where_it_is_defined():
    method = resolve_callable("json.decoder.JSONDecoder.decode")
    assert method == {"module": "json.decoder", "attr": "JSONDecoder.decode", "canonical": "json.decoder.JSONDecoder.decode"}
    reexported = resolve_callable("json.JSONDecoder.decode")  # json re-exports the class of json.decoder
    assert reexported["canonical"] == "json.decoder.JSONDecoder.decode"
    assert resolve_callable("json.JSONDecoder")["kind"] == "class"


def test_a_name_that_cannot_be_probed_says_why():
    assert "is a module" in resolve_callable("json.decoder")["error"]
    assert "has no attribute `nope`" in resolve_callable("json.decoder.nope")["error"]
    assert "not a dotted name" in resolve_callable("decode")["error"]
    assert "cannot be imported" in resolve_callable("no_such_package_xyz.module.f")["error"]
    assert "is a property" in resolve_callable("subprocess.Popen.universal_newlines")["error"]


def test_the_lookup_answers_on_one_marked_line_in_a_fresh_interpreter():
    names = ["json.decoder.JSONDecoder.decode", "json.nope"]
    out = subprocess.run([sys.executable, "-m", "evalpipe.probes.resolve"], input=json.dumps(names),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith(MARK)]
    answer = json.loads(line[len(MARK):])
    assert answer["names"] == resolve_names(names)  # the same answer as in this process
    assert "error" in answer["names"]["json.nope"] and answer["files"]
