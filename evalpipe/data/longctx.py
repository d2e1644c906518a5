"""Deterministic long-context probes whose prompts have exact token counts.

Three probes, each an lm-eval ``generate_until`` task (``tasks/longctx/``):

* ``passkey``  a pass key (``value_digits`` digits, default 5) hidden in filler text::

      A pass key is hidden in the text below. Find it and remember it. The grass is
      green. ... The pass key is 71432. Remember it. ... Here we go. - -
      What is the pass key? The pass key is

* ``multikey`` several ``key -> value`` needles (keys ``word-NN``, distinct
  values of ``value_digits`` digits); one key is asked, the others are distractors. Questions about different
  keys of one haystack share its ``haystack_id``::

      ... The value of key lemon-42 is 58329. ...
      What is the value of key lemon-42? The value of key lemon-42 is

* ``vartrack`` chains of assignments ``VAR QWXLP = 58329.``, ``VAR KDJSA = VAR QWXLP.``
  ... plus distractor chains bound to other values; asked for every name bound to the
  value::

      Which variables are assigned the value 58329? The variables are

The model's continuation is ``TARGET_DELIMITER + answer + STOP`` (`` 71432\\n``); the
task stops at ``"\\n"`` and scores lm-eval's ``exact_match`` after stripping leading and
trailing whitespace from response and answer. A vartrack ``answer`` is the chain's names
in chain order (= their order in the prompt) joined by ``VAR_SEPARATOR`` (``", "``):
order, separator and completeness all count.

Layout of every prompt: header, filler sentences with the needles between them, then
``pad`` units, then the question. The length is exact under the given tokenizer, counted
as the worker does (``len(tok.encode(prompt, add_special_tokens=False))``): whole filler
sentences are chosen from per-piece token costs measured in context, the rest of the
gap (less than one sentence) is filled with single-token pad units (`` -`` or the first
of ``PAD_UNITS`` that is one token per unit under this tokenizer), and every prompt is
re-encoded once to verify; when a tokenizer does not add up (merges across pieces), the
measured error corrects the filler budget and the pad, and a clear error is raised if
no exact hit is found. Needles sit at the sentence boundary nearest their target depth;
``depth`` is measured: the token index where the needle starts / ``length``.

Random draws come from string-seeded ``random.Random`` per (seed, probe, length,
haystack) (no global state, no hash randomisation), so the same spec and tokenizer give
byte-identical files; target depths cycle over all items in length order. Changing any
text or rule here changes the data: bump ``GENERATOR_VERSION``.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
import re
import string
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from evalpipe import atomic_files
from evalpipe.errors import UserError
from evalpipe.paths import data_dir

# Bump whenever generated text or layout changes: it is part of every fingerprint.
GENERATOR_VERSION = 1

PROBES = ("passkey", "multikey", "vartrack")
TASK_PROBE = {f"longctx_{p}": p for p in PROBES}  # lm-eval task name -> probe
DATA_DIR_NAME = "longctx"
# What the task YAMLs hold as data_files; the worker replaces it (see resolve_data_file).
DATA_FILE_PLACEHOLDER = "longctx/{probe}-{fingerprint}/test.jsonl"

TARGET_DELIMITER = " "  # the answer starts after one space: "... The pass key is" + " 71432"
STOP = "\n"  # the tasks' `until`
VAR_SEPARATOR = ", "
MAX_GEN_TOKS = {"passkey": 16, "multikey": 16, "vartrack": 64}  # the YAMLs' max_gen_toks

TEST_SEED = 4_000_037
TRAIN_SEED = 5_000_011  # default seed for training_pairs (distinct from TEST_SEED)
MIN_LENGTH = 64

# Filler: no digits and none of the needle/question words, so nothing in it can be
# mistaken for an answer.
FILLER = (
    " The grass is green.",
    " The sky is blue.",
    " The sun is yellow.",
    " Here we go.",
    " There and back again.",
    " The river flows to the sea.",
    " Birds sing in the morning.",
    " The road is long and quiet.",
)
# Candidate pad units, preferred first; each must add exactly one token per unit.
PAD_UNITS = (" -", " .", " ,", " *", ".", "-", "\n")
_ANCHOR = " Here we go."  # context in which piece costs are measured (a filler sentence end)

KEY_WORDS = (
    "apple", "lemon", "tiger", "cloud", "river", "stone", "maple", "pearl", "eagle", "candle",
    "falcon", "garden", "island", "jungle", "kettle", "ladder", "meadow", "needle", "orange",
    "pepper", "rabbit", "silver", "tomato", "violet",
)

HEADER = {
    "passkey": "A pass key is hidden in the text below. Find it and remember it.",
    "multikey": "Keys and their values are hidden in the text below. Remember them.",
    "vartrack": "Variables are assigned values in the text below. Track every assignment.",
}


# ----------------------------------------------------------------------------- spec


class LongCtxSpec(BaseModel):
    """What to generate. Tokenizer-independent; lengths are in the tokenizer's tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lengths: tuple[int, ...] = (2048, 4096, 8192, 16384)  # round lengths
    tp_sizes: tuple[int, ...] = (4, 16)  # tensor-parallel sizes whose split edges to probe
    sparse_block: int = 2048  # block size of a sparse/paged attention layout
    edge_bases: tuple[int, ...] | None = None  # lengths near which edges go; None: (sparse_block,)
    items_per_length: int = 4
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)  # needle depths, cycled over all items
    questions_per_haystack: int = 2  # multikey/vartrack: items sharing one haystack
    n_keys: int = 4  # multikey: needles per haystack (asked + distractors)
    n_chains: int = 3  # vartrack: chains per haystack (asked + distractors)
    chain_len: int = 4  # vartrack: names per chain
    # digits of every pass key / value (5: 10000-99999). A model whose tokenizer splits
    # long numbers into rare pieces may need fewer (configs/default.yaml explains why).
    value_digits: int = 5
    seed: int = TEST_SEED
    # lm-eval's RULER tasks (niah_single_1, ruler_vt, ...) run at `lengths` too, with this
    # many items per length (evalpipe.tasks.ruler; lm-eval's own builders make 500)
    ruler_items_per_length: int = 5

    @model_validator(mode="after")
    def _check(self) -> LongCtxSpec:
        if not self.lengths:
            raise ValueError("`lengths` is empty; give at least one length.")
        for n in self.lengths + (self.edge_bases or ()):
            if n < MIN_LENGTH:
                raise ValueError(f"length {n} is too small to hold a probe; use lengths of at least {MIN_LENGTH} tokens.")
        for t in self.tp_sizes:
            if t < 1:
                raise ValueError(f"tp size {t} is invalid; every tp size must be at least 1.")
        if self.sparse_block - 1 < MIN_LENGTH:
            raise ValueError(f"sparse_block {self.sparse_block} is too small; it must be at least {MIN_LENGTH + 1} so that sparse_block-1 holds a probe.")
        if self.items_per_length < 1:
            raise ValueError(f"items_per_length is {self.items_per_length}; it must be at least 1.")
        if self.ruler_items_per_length < 1:
            raise ValueError(f"ruler_items_per_length is {self.ruler_items_per_length}; it must be at least 1.")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"depths {list(self.depths)} are invalid; give at least one depth, each between 0 and 1.")
        for name in ("questions_per_haystack", "n_keys", "n_chains", "chain_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} is {getattr(self, name)}; it must be at least 1.")
        if not 1 <= self.value_digits <= 9:
            raise ValueError(f"value_digits is {self.value_digits}; it must be between 1 and 9.")
        distinct = len(_value_range(self.value_digits))
        if max(self.n_keys, self.n_chains) > distinct:
            raise ValueError(
                f"value_digits {self.value_digits} gives only {distinct} distinct values, fewer than n_keys/n_chains; use more digits."
            )
        if self.n_keys > len(KEY_WORDS):
            raise ValueError(f"n_keys {self.n_keys} exceeds the {len(KEY_WORDS)} distinct key words; use at most {len(KEY_WORDS)}.")
        if self.questions_per_haystack > min(self.n_keys, self.n_chains):
            raise ValueError(
                f"questions_per_haystack {self.questions_per_haystack} exceeds n_keys or n_chains; each question needs its own key and chain."
            )
        return self

    def bases(self) -> tuple[int, ...]:
        return self.edge_bases if self.edge_bases is not None else (self.sparse_block,)


def target_lengths(spec: LongCtxSpec) -> list[tuple[int, str, list[str]]]:
    """(length, kind, tags) sorted by length: the round lengths plus the layout edges.

    Edges: for each base b and tp size T, the smallest counts >= b with count % T in
    {0, 1, T-1} (tag ``tpT:r``: a sequence splitting evenly, or one token over/under,
    across T ranks), and sparse_block-1/sparse_block/sparse_block+1 (tags ``block-1``,
    ``block``, ``block+1``). Kind is ``round`` for a round length (it may carry edge tags
    too), else ``edge``.
    """
    tags: dict[int, list[str]] = {n: [] for n in spec.lengths}
    edges: list[tuple[int, str]] = []
    for b in spec.bases():
        for t in spec.tp_sizes:
            for r in sorted({0, 1 % t, (t - 1) % t}):
                edges.append((b + (r - b) % t, f"tp{t}:{r}"))
    blk = spec.sparse_block
    edges += [(blk - 1, "block-1"), (blk, "block"), (blk + 1, "block+1")]
    for n, tag in edges:
        if tag not in tags.setdefault(n, []):
            tags[n].append(tag)
    return [(n, "round" if n in spec.lengths else "edge", tags[n]) for n in sorted(tags)]


# ----------------------------------------------------------------------------- tokenizer


def _is_raw(tokenizer: Any) -> bool:
    """A bare `tokenizers.Tokenizer` (not a transformers wrapper)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover
        return False
    return isinstance(tokenizer, Tokenizer)


def tokenizer_digest(tokenizer: Any) -> str:
    """sha256 of what decides the tokenizer's encoding: its serialized pipeline (vocab,
    merges, normalizer, pre-tokenizer ...) when it has one, else its vocab."""
    backend = tokenizer if _is_raw(tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        state = json.loads(backend.to_str())
        # transformers toggles these on the backend during calls; they never change ids here.
        state.pop("truncation", None)
        state.pop("padding", None)
        content = json.dumps(state, sort_keys=True, ensure_ascii=False)
    else:
        content = type(tokenizer).__name__ + json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


class _Meter:
    """Token counts under one tokenizer, exactly as the worker encodes prompts."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.raw = _is_raw(tokenizer)
        self.fast = self.raw or bool(getattr(tokenizer, "is_fast", False))
        self._cost: dict[str, int] = {}
        self._units: list[str] | None = None

    def encode(self, text: str) -> tuple[int, list[tuple[int, int]] | None]:
        """Token count and (fast tokenizers) each token's character span."""
        if self.raw:
            enc = self.tok.encode(text, add_special_tokens=False)
            return len(enc.ids), enc.offsets
        if self.fast:
            enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            return len(enc["input_ids"]), enc["offset_mapping"]
        return self.count(text), None  # slow tokenizers have no offsets

    def count(self, text: str) -> int:
        if self.raw:
            return len(self.tok.encode(text, add_special_tokens=False).ids)
        # = len(tok.encode(text, add_special_tokens=False)), minus the "longer than the
        # model's maximum" log line.
        return len(self.tok(text, add_special_tokens=False, verbose=False)["input_ids"])

    def cost(self, piece: str) -> int:
        """Tokens `piece` adds after a filler sentence (in context: a SentencePiece-style
        tokenizer counts a standalone " The" differently)."""
        if piece not in self._cost:
            self._cost[piece] = self.count(_ANCHOR + piece) - self.count(_ANCHOR)
        return self._cost[piece]

    def token_at(self, text: str, offsets: list[tuple[int, int]] | None, char: int) -> int:
        """Index of the token holding character `char` (where a needle starts)."""
        if offsets is None:
            return self.count(text[:char])
        return next(i for i, (_, end) in enumerate(offsets) if end > char)

    def pad_units(self) -> list[str]:
        """PAD_UNITS that add exactly one token per unit in context come first."""
        if self._units is None:
            base = self.count(_ANCHOR + "\nQ")
            good = [u for u in PAD_UNITS if all(self.count(_ANCHOR + u * m + "\nQ") - base == m for m in (1, 2, 3, 7))]
            self._units = good + [u for u in PAD_UNITS if u not in good]
        return self._units


# ----------------------------------------------------------------------------- fitting


class _Haystack:
    """Header, filler and needles laid out to an exact token count for each question."""

    MAX_ROUNDS = 30

    def __init__(self, meter: _Meter, header: str, needles: list[tuple[str, float]], filler_rng: random.Random):
        self.m, self.header, self.needles, self.rng = meter, header, needles, filler_rng
        self.stream: list[str] = []  # filler sentences, drawn lazily so more can follow

    def _cost(self, sentence: str) -> int:
        # At least 1: a tokenizer that merges across sentences may measure 0 in context.
        return max(1, self.m.cost(sentence))

    def _filler(self, budget: int) -> list[str]:
        """Whole sentences costing at most `budget` tokens (estimated): a prefix of the
        random stream, then the longest sentences that still fit, to leave < 1 sentence."""
        out: list[str] = []
        used = 0
        while True:
            if len(out) == len(self.stream):
                self.stream.append(self.rng.choice(FILLER))
            c = self._cost(self.stream[len(out)])
            if used + c > budget:
                break
            out.append(self.stream[len(out)])
            used += c
        by_cost = sorted(FILLER, key=lambda s: -self._cost(s))  # stable: list order breaks ties
        while (fit := next((s for s in by_cost if self._cost(s) <= budget - used), None)) is not None:
            out.append(fit)
            used += self._cost(fit)
        return out

    def _place(self, sentences: list[str], length: int) -> tuple[str, list[int], int]:
        """Stem text (header + filler with needles), each needle's start character, and
        the stem's estimated token count. A needle goes to the sentence boundary whose
        estimated token position is nearest depth * length, never before an earlier needle."""
        head = self.m.count(self.header)
        bounds = [head]
        for s in sentences:
            bounds.append(bounds[-1] + self._cost(s))
        slots: list[list[int]] = [[] for _ in bounds]
        extra, k = 0, 0
        for j in sorted(range(len(self.needles)), key=lambda j: (self.needles[j][1], j)):
            want = self.needles[j][1] * length - extra
            i = bisect.bisect_left(bounds, want, lo=k)
            cands = [c for c in (i - 1, i) if k <= c < len(bounds)]
            k = min(cands, key=lambda c: (abs(bounds[c] - want), c))
            slots[k].append(j)
            extra += self.m.cost(self.needles[j][0])
        parts, chars, pos = [self.header], [0] * len(self.needles), len(self.header)
        for b, slot in enumerate(slots):
            for j in slot:
                chars[j] = pos
                parts.append(self.needles[j][0])
                pos += len(self.needles[j][0])
            if b < len(sentences):
                parts.append(sentences[b])
                pos += len(sentences[b])
        return "".join(parts), chars, bounds[-1] + extra

    def _pad(self, stem: str, question: str, length: int, k: int, limit: int):
        """(text, offsets, k, unit): k pad units before the question, k corrected by the
        measured error; None if no unit reaches exactly `length` with 0..limit units."""
        for unit in self.m.pad_units():
            kk = k
            for _ in range(3):
                if not 0 <= kk <= limit:
                    break
                text = stem + unit * kk + question
                n, offsets = self.m.encode(text)
                if n == length:
                    return text, offsets, kk, unit
                kk += length - n
        return None

    def fit(self, questions: list[str], length: int, what: str) -> tuple[list[tuple], list[int]]:
        """One prompt of exactly `length` tokens per question (text, offsets, pad count, unit),
        and the needles' start characters (shared: only pad and question differ).

        Usually one encode per prompt: the additive estimate is right and the pad hits.
        Otherwise the filler budget is searched (secant, then bisection once bracketed)
        on the measured count of the first question that missed."""
        cost = self.m.cost
        qcost = [cost(q) for q in questions]
        fixed = self.m.count(self.header) + sum(cost(t) for t, _ in self.needles) + max(qcost)
        budget = length - fixed
        if budget < 0:
            raise UserError(
                f"target length {length} cannot hold the {what} header, needles and question ({fixed} tokens under this tokenizer); use longer lengths or fewer keys/chains."
            )
        widest = max(self._cost(s) for s in FILLER)
        tried: list[tuple[int, int]] = []  # (budget, measured count - aim)
        for _ in range(self.MAX_ROUNDS):
            stem, chars, est = self._place(self._filler(budget), length)
            out: list[tuple] = []
            for q, qc in zip(questions, qcost):
                limit = widest + max(qcost) - qc + 1  # more pad than this and a sentence would fit
                got = self._pad(stem, q, length, length - est - qc, limit)
                if got is None:  # the estimate was off: measure
                    n = self.m.count(stem + q)
                    if length - limit <= n <= length:
                        got = self._pad(stem, q, length, length - n, limit)
                        if got is None:
                            raise UserError(
                                f"cannot make a {what} prompt of exactly {length} tokens: no pad unit among {list(PAD_UNITS)} adds one token per unit under this tokenizer."
                            )
                    else:
                        tried.append((budget, n - (length - limit // 2)))
                        break
                out.append(got)
            else:
                return out, chars
            next_budget = self._next_budget(tried)
            if next_budget is None:
                break
            budget = next_budget
        raise UserError(f"cannot make a {what} prompt of exactly {length} tokens: the filler budget search did not converge under this tokenizer.")

    @staticmethod
    def _next_budget(tried: list[tuple[int, int]]) -> int | None:
        b, e = tried[-1]
        short = [t for t in tried if t[1] < 0]
        long = [t for t in tried if t[1] > 0]
        if short and long:  # bracketed: interpolate strictly inside the bracket
            (b0, e0), (b1, e1) = max(short), min(long)
            if b1 - b0 <= 1:
                return None
            return min(max(b0 + round((b1 - b0) * -e0 / (e1 - e0)), b0 + 1), b1 - 1)
        slope = 1.0
        if len(tried) >= 2 and tried[-2][0] != b and (tried[-2][1] - e) / (tried[-2][0] - b) > 0:
            slope = (tried[-2][1] - e) / (tried[-2][0] - b)
        step = round(e / slope) or (1 if e > 0 else -1)
        return b - step if b - step >= 0 else None


# ----------------------------------------------------------------------------- probes


def _value_range(digits: int) -> range:
    return range(10 ** (digits - 1) if digits > 1 else 0, 10**digits)


def _values(rng: random.Random, n: int, spec: LongCtxSpec) -> list[int]:
    return rng.sample(_value_range(spec.value_digits), n)  # distinct, value_digits digits each


def _passkey(rng: random.Random, depths: list[float], spec: LongCtxSpec):
    (v,) = _values(rng, 1, spec)
    needles = [(f" The pass key is {v}. Remember it.", depths[0])]
    return needles, [("\nWhat is the pass key? The pass key is", str(v), [0])]


def _multikey(rng: random.Random, depths: list[float], spec: LongCtxSpec):
    keys = [f"{w}-{rng.randint(10, 99)}" for w in rng.sample(KEY_WORDS, spec.n_keys)]
    values = _values(rng, spec.n_keys, spec)
    where = list(depths) + [rng.random() for _ in range(spec.n_keys - len(depths))]  # distractors anywhere
    needles = [(f" The value of key {k} is {v}.", d) for k, v, d in zip(keys, values, where)]
    questions = [
        (f"\nWhat is the value of key {keys[i]}? The value of key {keys[i]} is", str(values[i]), [i])
        for i in range(len(depths))
    ]
    return needles, questions


def _vartrack(rng: random.Random, depths: list[float], spec: LongCtxSpec):
    names: list[str] = []
    while len(names) < spec.n_chains * spec.chain_len:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        if name not in names:
            names.append(name)
    values = _values(rng, spec.n_chains, spec)
    needles: list[tuple[str, float]] = []
    questions = []
    for c in range(spec.n_chains):
        chain = names[c * spec.chain_len : (c + 1) * spec.chain_len]
        if c < len(depths):  # asked: first link at the depth, the rest spread to the end
            d = depths[c]
            where = [d + (1 - d) * j / spec.chain_len for j in range(spec.chain_len)]
        else:  # distractor chain: anywhere, in order
            where = sorted(rng.random() for _ in range(spec.chain_len))
        first = len(needles)
        for j, (name, w) in enumerate(zip(chain, where)):
            rhs = str(values[c]) if j == 0 else f"VAR {chain[j - 1]}"
            needles.append((f" VAR {name} = {rhs}.", w))
        if c < len(depths):
            q = f"\nWhich variables are assigned the value {values[c]}? The variables are"
            questions.append((q, VAR_SEPARATOR.join(chain), list(range(first, first + spec.chain_len))))
    return needles, questions


_BUILDERS = {"passkey": _passkey, "multikey": _multikey, "vartrack": _vartrack}


def _check_probe(probe: str) -> None:
    if probe not in _BUILDERS:
        raise UserError(f"unknown probe `{probe}`; known: {', '.join(PROBES)}.")


def _generate(probe: str, meter: _Meter, spec: LongCtxSpec, targets: list[tuple[int, str, list[str]]]) -> list[dict]:
    per_haystack = 1 if probe == "passkey" else spec.questions_per_haystack
    items: list[dict] = []
    g = 0  # depths cycle over all items, so every depth is covered across lengths
    for length, kind, tags in targets:
        for h, start in enumerate(range(0, spec.items_per_length, per_haystack)):
            n_q = min(per_haystack, spec.items_per_length - start)
            depths = [spec.depths[(g + i) % len(spec.depths)] for i in range(n_q)]
            g += n_q
            key = f"{GENERATOR_VERSION}:{spec.seed}:{probe}:{length}:{h}"
            needles, questions = _BUILDERS[probe](random.Random(key), depths, spec)
            hay = _Haystack(meter, HEADER[probe], needles, random.Random(key + ":filler"))
            fits, chars = hay.fit([q for q, _, _ in questions], length, probe)
            for qi, ((_, answer, asked), (text, offsets, pad, unit)) in enumerate(zip(questions, fits)):
                pos = [meter.token_at(text, offsets, chars[j]) for j in asked]
                item = {
                    "id": f"{probe}-{length}-{h}-{qi}",
                    "doc_id": len(items),
                    "probe": probe,
                    "prompt": text,
                    "answer": answer,
                    "length": meter.count(text) if offsets is None else len(offsets),
                    "target_length": length,
                    "length_kind": kind,
                    "length_tags": list(tags),
                    "depth": pos[0] / length,
                    "target_depth": depths[qi],
                    "needle_pos": pos[0],
                    "haystack_id": f"{probe}-{length}-{h}",
                    "pad_tokens": pad,
                    "pad_unit": unit,
                }
                if probe == "vartrack":
                    item["chain_pos"] = pos
                assert item["length"] == length, (item["id"], item["length"])
                items.append(item)
    return items


# ----------------------------------------------------------------------------- public API


def generate(probe: str, tokenizer: Any, spec: LongCtxSpec | None = None) -> list[dict]:
    """All items of one probe for `spec` (default LongCtxSpec()), ordered by length."""
    _check_probe(probe)
    spec = spec or LongCtxSpec()
    return _generate(probe, _Meter(tokenizer), spec, target_lengths(spec))


def generate_at(probe: str, tokenizer: Any, spec: LongCtxSpec, lengths: list[tuple[int, list[str]]]) -> list[dict]:
    """Items of one probe at exactly the given lengths (each with its tags), not the spec's
    own lengths and edges: what a scenario builds its prompts from (evalpipe.data.scenarios)."""
    _check_probe(probe)
    return _generate(probe, _Meter(tokenizer), spec, [(n, "edge", list(tags)) for n, tags in lengths])


def fingerprint(probe: str, spec: LongCtxSpec, tokenizer: Any) -> str:
    """sha256 over GENERATOR_VERSION, probe, spec (edge bases resolved) and tokenizer content."""
    _check_probe(probe)
    payload = {
        "generator_version": GENERATOR_VERSION,
        "probe": probe,
        "spec": {**spec.model_dump(mode="json"), "edge_bases": list(spec.bases())},
        "tokenizer": tokenizer_digest(tokenizer),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def probe_dir(probe: str, spec: LongCtxSpec, tokenizer: Any, out_root: Path) -> Path:
    return Path(out_root) / DATA_DIR_NAME / f"{probe}-{fingerprint(probe, spec, tokenizer)[:12]}"


def _intact(directory: Path, fp: str) -> bool:
    meta, data = directory / "meta.json", directory / "test.jsonl"
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
        return info.get("fingerprint") == fp and hashlib.sha256(data.read_bytes()).hexdigest() == info.get("data_sha256")
    except (OSError, ValueError):
        return False


def write_probe(probe: str, tokenizer: Any, spec: LongCtxSpec | None = None, out_root: Path | None = None) -> Path:
    """Write `<out_root>/longctx/<probe>-<fp[:12]>/test.jsonl` + meta.json; returns the
    jsonl path. Idempotent: an intact copy with the same fingerprint is left alone.
    out_root defaults to evalpipe's data directory."""
    spec = spec or LongCtxSpec()
    out_root = Path(out_root) if out_root is not None else data_dir()
    fp = fingerprint(probe, spec, tokenizer)
    directory = Path(out_root) / DATA_DIR_NAME / f"{probe}-{fp[:12]}"
    data = directory / "test.jsonl"
    if _intact(directory, fp):
        return data
    items = generate(probe, tokenizer, spec)
    text = "".join(json.dumps(it, sort_keys=True, ensure_ascii=False) + "\n" for it in items)
    atomic_files.write_text(data, text)
    counts: dict[str, int] = {}
    for it in items:
        counts[str(it["target_length"])] = counts.get(str(it["target_length"]), 0) + 1
    meta = {
        "generator_version": GENERATOR_VERSION,
        "probe": probe,
        "fingerprint": fp,
        "spec": {**spec.model_dump(mode="json"), "edge_bases": list(spec.bases())},
        "tokenizer": {
            "name_or_path": str(getattr(tokenizer, "name_or_path", "") or ""),
            "class": type(tokenizer).__name__,
            "sha256": tokenizer_digest(tokenizer),
        },
        "counts_per_length": counts,
        "n_items": len(items),
        "data_file": data.name,
        "data_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
    atomic_files.write_json(directory / "meta.json", meta)  # written last: it marks the set complete
    return data


_PLACEHOLDER_RE = re.compile(r"^longctx/(?P<probe>[a-z]+)-\{fingerprint\}/test\.jsonl$")


def is_placeholder(relative: str | Path) -> bool:
    """Whether a task's relative data file is a longctx placeholder."""
    return _PLACEHOLDER_RE.match(Path(relative).as_posix()) is not None


def resolve_data_file(relative: str | Path, tokenizer: Any, spec: LongCtxSpec | None, data_dir: Path) -> Path | None:
    """For a task's `data_files` entry `longctx/<probe>-{fingerprint}/test.jsonl`: write
    (or reuse) that probe's set for this tokenizer and spec and return its path; None for
    any other path (not ours)."""
    m = _PLACEHOLDER_RE.match(Path(relative).as_posix())
    if m is None:
        return None
    return write_probe(m["probe"], tokenizer, spec, data_dir)


def training_pairs(
    probe: str,
    tokenizer: Any,
    n: int,
    lengths: list[int],
    seed: int = TRAIN_SEED,
    spec: LongCtxSpec | None = None,
    test_spec: LongCtxSpec | None = None,
) -> list[tuple[str, str]]:
    """`n` training (prompt, answer) pairs at the given (round) lengths, interleaved
    across lengths, from `seed` (must differ from the test seed). No prompt equals a test
    prompt of `test_spec` (default: `spec`, else LongCtxSpec())."""
    _check_probe(probe)
    base = spec or LongCtxSpec()
    test_spec = test_spec or base
    if seed == test_spec.seed:
        raise ValueError(f"training seed {seed} equals the test seed; pick another so training never sees test items.")
    lengths = sorted(set(lengths))
    train = LongCtxSpec(**{**base.model_dump(), "lengths": lengths, "seed": seed, "items_per_length": math.ceil(n / len(lengths))})
    meter = _Meter(tokenizer)
    items = _generate(probe, meter, train, [(length, "round", []) for length in lengths])
    rank = {id(it): i for i, it in enumerate(items)}
    per = train.items_per_length
    items = sorted(items, key=lambda it: (rank[id(it)] % per, it["target_length"]))[:n]
    shared = {length for length, _, _ in target_lengths(test_spec)} & set(lengths)
    if shared:
        test_prompts = {it["prompt"] for it in _generate(probe, meter, test_spec, target_lengths(test_spec)) if it["target_length"] in shared}
        clash = [it["id"] for it in items if it["prompt"] in test_prompts]
        if clash:
            raise AssertionError(f"training prompts {clash[:3]} equal test prompts; use another seed.")
    return [(it["prompt"], it["answer"]) for it in items]

