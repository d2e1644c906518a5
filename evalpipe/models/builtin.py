"""Built-in tiny models: trained by evalpipe from a recipe, shipped as trained files.

``tiny-gsm`` is a small Llama-architecture causal LM with a byte-level BPE tokenizer,
trained for a few CPU minutes on :mod:`evalpipe.data.gsm_synth` problems laid out exactly
like lm-eval's gsm8k few-shot prompt::

    Question: <q>\\nAnswer: <worked steps>\\n#### N\\n\\nQuestion: <q>\\nAnswer: ...

so that 4-shot greedy decoding answers a useful share of the synthetic test split (about
55% strict-match after this phase; see the recipe notes above ``_tiny_gsm_spec``). A
long-context phase follows (notes above ``_LONGCTX_STAGES``): passkey prompts of up to
2048 tokens with 2-digit keys, GSM batches in between, after which the model retrieves
pass keys up to 2048 tokens and answers 48.2% of the GSM items (the shipped files). It exists to give the
A/B pipeline a real model with real, non-trivial outputs on machines where nothing can
be downloaded.

A build is deterministic on one machine: a fixed seed, a fixed torch thread count and a
fixed data stream give byte-identical ``model.safetensors`` and tokenizer files on the
same CPU kind and torch version. Across CPUs it is not (the same recipe scored 0.595
strict-match when built on one x86 CPU and 0.482 on another, the AMD EPYC with AVX-512
that built the shipped files: the vectorised float kernels round differently and 600
training steps amplify it). So the trained files ship inside the
package (``shipped/<name>/``, with the spec hash, per-file sha256 and the machine they
were built on in ``evalpipe-model.json``), and runs serve those (:func:`ensure_builtin`);
``python -m evalpipe.models.build NAME --ship`` regenerates them after a recipe change.
:func:`build` trains into the cache (or a given directory): a spec-hashed directory,
built in a temporary directory and renamed into place under a file lock.

Heavy imports (torch, transformers, tokenizers) happen inside functions, so importing
this module stays cheap.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from evalpipe.errors import UserError

Progress = Callable[[str], None]

BUILTIN_PREFIX = "builtin:"
INFO_FILE = "evalpipe-model.json"
WEIGHT_FILES = ("model.safetensors",)
TOKENIZER_FILES = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")
CONFIG_FILES = ("config.json", "generation_config.json")
# Everything an engine reads from the directory: two directories with one fingerprint
# give the same outputs on the same engine.
FINGERPRINT_FILES = tuple(sorted(WEIGHT_FILES + TOKENIZER_FILES + CONFIG_FILES))
# The trained files of each built-in model ship inside the package (shipped/<name>/):
# training on another CPU gives other weights (float rounding in the kernels differs),
# so a build on first use would give every machine its own model and its own figures.
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
REGENERATE = "python -m evalpipe.models.build {name} --ship"

BOS, EOS, UNK, PAD = "<s>", "</s>", "<unk>", "<pad>"
SPECIAL_TOKENS = [BOS, EOS, UNK, PAD]  # ids 0..3, in this order


# Recipe notes for tiny-gsm (2 cores, torch 2.13 CPU; strict-match = lm-eval's gsm8k
# regex, 4-shot greedy, on 200-600 synthetic test items; ~0.4-0.6 s per step). Builds on
# another CPU give other weights, so these figures compare recipes on the machine that
# measured them; the shipped files score 0.482 after both phases:
#   digits split, h128 x4 layers, 350 steps, lr 3e-3 ............................ 12%
#   same, lr 6e-3 ................................................................ 10%
#   same, smaller numbers (results <= 100) ....................................... 16%
#   digits split, h192 x3 layers, 300 steps, lr 4e-3, results <= 200 ............. 28%
#   whole-number tokens, h128 x4, 350 steps, lr 6e-3, results <= 100 ............. 37%
#   whole-number tokens, h128 x4, same, results <= 200 ........................... 43%
#   whole-number tokens, h256 x2, 300 steps, lr 4e-3, results <= 100 ............. 50%
#   whole-number tokens, h192 x3, 300 steps, lr 4e-3, results <= 200 ............. 41%
#   whole-number tokens, h192 x3, 300 steps, lr 4e-3, results <= 100 (chosen) .... 55%
# With single-digit tokens the model mostly failed to copy operands and to add (carries
# run against left-to-right generation); with every number 0..299 one token, copying is
# one step and +/-/*// become table look-ups. Multiplication and division are learnt
# well; addition/subtraction of larger numbers and 3-step chains stay weak (3-step ~4%).
# Full build: ~3 min wall on an idle machine (~10 s data + tokenizer, ~175 s training),
# proportionally longer when other jobs share the cores.
def _tiny_gsm_spec() -> dict[str, Any]:
    from evalpipe.data import gsm_synth, longctx

    return {
        "arch": "llama",
        # tokenizer
        "vocab_size": 1536,
        "tokenizer_items": 4000,  # corpus items the BPE is trained on
        "split_digits": False,  # True: every digit its own token
        "number_tokens": 300,  # make 0..N-1 single tokens (needs split_digits False)
        # model
        "hidden_size": 192,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        # training
        "seed": 1234,
        "torch_threads": 2,
        "steps": 300,
        "batch_size": 8,
        "seq_len": 512,
        "lr": 4e-3,
        "min_lr_ratio": 0.1,
        "warmup_steps": 30,
        "weight_decay": 0.01,
        "adam_betas": [0.9, 0.95],
        "grad_clip": 1.0,
        "loss_on": "answers",  # "answers": only answer text + the following separator; "all"
        "bos_fraction": 0.25,  # share of training windows that start with <s>
        # data
        "data_generator_version": gsm_synth.GENERATOR_VERSION,
        "data_ranges": {k: list(v) if isinstance(v, tuple) else v
                        for k, v in dataclasses.asdict(gsm_synth.RANGES).items()},
        "corpus_seed": gsm_synth.CORPUS_SEED,
        "held_out_splits": {k: list(v) for k, v in gsm_synth.SPLITS.items()},
        # long-context phase: see _train_longctx and the recipe notes above _LONGCTX_STAGES
        "longctx_stages": copy.deepcopy(_LONGCTX_STAGES),
        "longctx_gsm_every": 2,  # every 2nd step of the phase is a GSM batch, so arithmetic stays
        "longctx_value_digits": 2,
        "longctx_seed": longctx.TRAIN_SEED,
        "longctx_generator_version": longctx.GENERATOR_VERSION,
    }


# Long-context phase of tiny-gsm (after the GSM phase; fresh AdamW per stage, warm-up
# over a tenth of the stage, cosine to a tenth of the peak). Trained on the passkey probe
# format (evalpipe.data.longctx.training_pairs: its own seed, never a test prompt), loss
# on the answer and the newline after it. Measured on the default test items (HF greedy,
# 2 AMD EPYC cores):
#   5-digit keys, 400 steps at 96-2048 tokens (two runs) ..................... 0 / 15 at 2047-2063
#   5-digit keys, 300-400 steps of dense drills (many needles, repeated numbers)  0
#   3-digit keys 100-299, 300 steps at 256-2048, 240 at 96-128 tokens ........ 0 (loss at chance)
#   2-digit keys, 300 steps at 96-128 tokens, no GSM batches ................. 6 / 6 at 128-256
#                 (GSM forgotten: answer loss 0.16 -> 14.5)
#   2-digit keys, 200 steps at 128 tokens, every 2nd step GSM ................ 4 / 15 at 2047-2063
#   then 100 steps at 512/1024/2048 tokens, every 2nd step GSM (chosen) ...... 15 / 15 at 2047-2063,
#                 6 / 6 at 128-512; GSM answer loss 0.16 -> 0.10 (the GSM batches keep training it)
# The answer-loss never left the uniform level for keys whose tokens are rare in the
# GSM-trained vocabulary (3-5 digit numbers split into pieces the model hardly saw):
# copying needs a distinct embedding per value; 10-99 are well-trained single tokens.
_LONGCTX_STAGES: list[dict[str, Any]] = [
    {"steps": 200, "lr": 4e-3, "lengths": [128], "probes": ["passkey"], "tokens_per_step": 6144},
    {"steps": 100, "lr": 2e-3, "lengths": [512, 1024, 2048], "probes": ["passkey"], "tokens_per_step": 4096},
]


# name -> factory of the default spec (a factory keeps module import light)
BUILTIN_MODELS: dict[str, Callable[[], dict[str, Any]]] = {
    "tiny-gsm": _tiny_gsm_spec,
}


@dataclass
class BuiltModel:
    path: Path
    fingerprint: str
    info: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.info.get("name", self.path.name)


# ----------------------------------------------------------------------------- names & specs


def is_builtin(spec: str) -> bool:
    """True for model strings like ``builtin:tiny-gsm``."""
    return isinstance(spec, str) and spec.startswith(BUILTIN_PREFIX)


def builtin_name(spec: str) -> str:
    """``builtin:tiny-gsm`` -> ``tiny-gsm`` (a bare name passes through)."""
    return spec[len(BUILTIN_PREFIX):] if is_builtin(spec) else spec


def _check_name(name: str) -> str:
    name = builtin_name(name)
    if name not in BUILTIN_MODELS:
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise UserError(f"unknown built-in model {name!r}; known built-in models: {known}")
    return name


def model_spec(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    name = _check_name(name)
    spec = copy.deepcopy(BUILTIN_MODELS[name]())
    for k, v in (overrides or {}).items():
        if k not in spec:
            raise UserError(f"unknown spec key {k!r} for built-in model {name!r}; keys: {', '.join(sorted(spec))}")
        spec[k] = v
    return spec


def spec_hash(name: str, spec: dict[str, Any]) -> str:
    blob = json.dumps({"name": name, "spec": spec}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_path(name: str, overrides: dict[str, Any] | None = None) -> Path:
    from evalpipe.paths import models_dir

    name = _check_name(name)
    return models_dir() / f"{name}-{spec_hash(name, model_spec(name, overrides))}"


def fingerprint_dir(path: Path) -> str:
    """sha256 over the weight, tokenizer and config files (name + bytes), sorted by file name."""
    h = hashlib.sha256()
    for fname in FINGERPRINT_FILES:
        p = Path(path) / fname
        if not p.exists():
            continue
        h.update(fname.encode() + b"\0")
        _hash_into(h, p)
        h.update(b"\0")
    return h.hexdigest()


def _hash_into(h, path: Path) -> None:
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)


def load_built(path: Path) -> BuiltModel | None:
    """The model built into ``path`` as its info file records it (None without one)."""
    info_path = path / INFO_FILE
    if not info_path.exists():
        return None
    info = json.loads(info_path.read_text(encoding="utf-8"))
    return BuiltModel(path=path, fingerprint=info["fingerprint"], info=info)


# ----------------------------------------------------------------------------- public entry points


class ShippedModelError(UserError):
    """The shipped files of a built-in model are missing, altered or from another recipe."""


def shipped_path(name: str) -> Path:
    return SHIPPED_DIR / _check_name(name)


def ensure_builtin(name: str, progress: Progress | None = None) -> BuiltModel:
    """The shipped model for ``name`` (e.g. ``tiny-gsm`` or ``builtin:tiny-gsm``), verified.

    Checks that the shipped files were built from the recipe in this module (spec hash)
    and that every file still has the sha256 recorded at build time, so a run never
    serves a model other than the one its fingerprint names.
    """
    name = _check_name(name)
    path = shipped_path(name)
    model = load_built(path)
    if model is None:
        raise ShippedModelError(
            f"the shipped files of built-in model {name!r} are missing ({path / INFO_FILE}); "
            f"restore them from the repository (git checkout -- {path}) or rebuild them: {REGENERATE.format(name=name)}")
    want = spec_hash(name, model_spec(name))
    if model.info.get("spec_hash") != want:
        raise ShippedModelError(
            f"the shipped {name} in {path} was built from another recipe (spec hash "
            f"{model.info.get('spec_hash')}, evalpipe/models/builtin.py now gives {want}); "
            f"rebuild the shipped files: {REGENERATE.format(name=name)}")
    # The build recorded the fingerprint and these per-file digests from the same bytes,
    # so every fingerprinted file matching its digest is the fingerprint check: each file
    # is read once, and a mismatch names the file.
    files = model.info.get("files", {})
    if sorted(files) != sorted(f for f in FINGERPRINT_FILES if (path / f).exists()) or not files:
        raise ShippedModelError(f"{path / INFO_FILE} does not list a sha256 for every model file; "
                                f"restore the directory from the repository: git checkout -- {path}")
    for fname, digest in files.items():
        if _file_sha256(path / fname) != digest:
            raise ShippedModelError(
                f"shipped file {path / fname} does not match its recorded sha256 (altered or truncated); "
                f"restore it from the repository: git checkout -- {path}")
    if progress:
        progress(f"shipped {name}, fingerprint {model.fingerprint[:12]}")
    return model


def _file_sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.sha256()
    _hash_into(h, path)
    return h.hexdigest()


def ship(name: str, progress: Progress | None = None) -> BuiltModel:
    """Train ``name`` from its recipe and replace its shipped files (the maintainers' step
    after a recipe change: ``python -m evalpipe.models.build NAME --ship``)."""
    name = _check_name(name)
    target = shipped_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}.ship-"))
    try:
        model = build(name, out_dir=staging / name, progress=progress)
        old = target.with_name(f".{name}.old")
        if target.exists():
            os.replace(target, old)
        os.replace(model.path, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BuiltModel(path=target, fingerprint=model.fingerprint, info=model.info)


def build(
    name: str = "tiny-gsm",
    spec_overrides: dict[str, Any] | None = None,
    out_dir: Path | None = None,
    progress: Progress | None = None,
) -> BuiltModel:
    """Build (or reuse) a built-in model.

    ``out_dir`` defaults to ``models_dir()/<name>-<spec hash>``. An existing, complete
    directory is returned without rebuilding. Concurrent builders of the same directory
    serialise on a lock file beside it; the loser finds the winner's result.
    """
    name = _check_name(name)
    spec = model_spec(name, spec_overrides)
    target = Path(out_dir) if out_dir is not None else default_path(name, spec_overrides)
    say = progress or (lambda _msg: None)

    existing = load_built(target)
    if existing is not None:
        return existing
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "a+") as lock_fh:
        if _locked(lock_fh):
            say(f"another process is building {target.name}; waiting for it")
        fcntl.flock(lock_fh.fileno(), fcntl.LOCK_EX)
        try:
            existing = load_built(target)
            if existing is not None:
                return existing
            if target.exists():
                # Builds are renamed into place whole, so this is not ours: never delete it.
                raise FileExistsError(f"{target} exists but holds no {INFO_FILE}; move it away to build there")
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.tmp-"))
            try:
                info = _build_into(tmp, name, spec, say)
                _make_readable(tmp)
                os.replace(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            fcntl.flock(lock_fh.fileno(), fcntl.LOCK_UN)
    return BuiltModel(path=target, fingerprint=info["fingerprint"], info=info)


def _make_readable(path: Path) -> None:
    """mkdtemp makes 0700 dirs (and some writers 0600 files); a shared cache wants umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)
    for p in path.iterdir():
        os.chmod(p, 0o666 & ~umask)


def _locked(fh) -> bool:
    """True if someone else holds the lock right now (only used for a progress message)."""
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return False


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(spec: dict[str, Any], texts: list[str]):
    """Byte-level BPE (``tokenizers``); no automatic <s> (prompts encode as written).

    With ``split_digits`` every digit is a token; otherwise ``number_tokens`` > 0 makes
    each of 0..number_tokens-1 a single token in every context it appears in.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if spec["split_digits"]:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"],
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    if spec.get("number_tokens"):
        # BPE only merges what is frequent; seeing every number in each of the contexts it
        # takes (after a space, "<<", an operator, "=" and ">>") makes each a single token.
        nums = [f" {n} <<{n}+{n}={n}>>{n} ${n}" for n in range(spec["number_tokens"])]
        texts = list(texts) + nums * 3
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def _save_tokenizer(tok, out: Path, model_max_length: int) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out))
    # Newer transformers no longer write special_tokens_map.json; older readers (and
    # some engines) still look for it, so always provide it.
    stm = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD}
    (out / "special_tokens_map.json").write_text(json.dumps(stm, indent=2, sort_keys=True) + "\n")
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update({"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False})
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- training data


def _windows(spec: dict[str, Any], tok, corpus: Iterator[dict], n_windows: int):
    """Pack formatted examples into ``n_windows`` training windows of ``seq_len`` tokens.

    Every window starts at an example boundary (like an eval prompt does), optionally
    after <s>. Labels are -100 outside the trained spans: with ``loss_on="answers"`` the
    model is trained on the answer text and the ``\\n\\nQuestion:`` that follows it (so it
    learns to stop), not on the questions themselves.
    """
    import random

    import numpy as np
    import torch

    from evalpipe.data.gsm_synth import format_example

    T = spec["seq_len"]
    bos_id, pad_id = tok.token_to_id(BOS), tok.token_to_id(PAD)
    rng = random.Random(spec["seed"] + 1)
    est_chars = T * 4  # generous; truncated after encoding
    texts, spans_all, with_bos = [], [], []
    for _ in range(n_windows):
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = 0
        while pos < est_chars:
            ex = format_example(next(corpus))
            if parts:
                pos += 2  # "\n\n"
                if spans:  # the separator + "Question:" after an answer is trained
                    spans[-1] = (spans[-1][0], pos + len("Question:"))
            a = ex.index("\nAnswer:") + len("\nAnswer:")
            spans.append((pos + a, pos + len(ex)))
            parts.append(ex)
            pos += len(ex)
        texts.append("\n\n".join(parts))
        spans_all.append(spans)
        with_bos.append(rng.random() < spec["bos_fraction"])
    encs = tok.encode_batch(texts)
    ids = torch.full((n_windows, T), pad_id, dtype=torch.long)
    labels = torch.full((n_windows, T), -100, dtype=torch.long)
    for i, enc in enumerate(encs):
        tid = np.asarray(enc.ids, dtype=np.int64)
        if spec["loss_on"] == "all":
            train = np.ones(len(tid), dtype=bool)
        else:
            starts = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
            span = np.asarray(spans_all[i], dtype=np.int64)
            k = np.searchsorted(span[:, 1], starts, side="right")  # first span ending after start
            ok = k < len(span)
            train = ok & (span[np.minimum(k, len(span) - 1), 0] <= starts)
        if with_bos[i]:
            tid = np.concatenate([[bos_id], tid])
            train = np.concatenate([[False], train])
        _put_row(ids, labels, i, tid[:T], train[:T])
    return ids, labels


def _put_row(ids, labels, i: int, tid, train) -> None:
    """Row i of a batch: the token ids, and as labels the next token where it is trained
    (position p predicts token p+1), -100 elsewhere."""
    import numpy as np
    import torch

    n = len(tid)
    ids[i, :n] = torch.from_numpy(tid)
    labels[i, : n - 1] = torch.from_numpy(np.where(train, tid, -100)[1:])


def _answer_windows(tok, pairs: list[tuple[str, str]]):
    """One padded batch of ``prompt + " " + answer + "\\n"``; loss on the answer and the newline."""
    import numpy as np
    import torch

    from evalpipe.data.longctx import STOP, TARGET_DELIMITER

    encs = tok.encode_batch([p + TARGET_DELIMITER + a + STOP for p, a in pairs])
    width = max(len(e.ids) for e in encs)
    ids = torch.full((len(encs), width), tok.token_to_id(PAD), dtype=torch.long)
    labels = torch.full((len(encs), width), -100, dtype=torch.long)
    for i, ((prompt, _), enc) in enumerate(zip(pairs, encs)):
        tid = np.asarray(enc.ids, dtype=np.int64)
        starts = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)[:, 0]
        _put_row(ids, labels, i, tid, starts >= len(prompt))
    return ids, labels


def _longctx_schedule(spec: dict[str, Any], stage: dict[str, Any]) -> list[tuple[str, int]]:
    """Per step: ("gsm", 0) or ("probe", length); probe steps cycle through the lengths."""
    every, lengths = spec["longctx_gsm_every"], stage["lengths"]
    out: list[tuple[str, int]] = []
    probe_steps = 0
    for step in range(stage["steps"]):
        if every and step % every == every - 1:
            out.append(("gsm", 0))
        else:
            out.append(("probe", lengths[probe_steps % len(lengths)]))
            probe_steps += 1
    return out


def _train_longctx(model, spec: dict[str, Any], tok, corpus: Iterator[dict], say: Progress, t0: float) -> list[float]:
    """The long-context phase: each stage trains on probe prompts of its lengths, every
    ``longctx_gsm_every``-th step on GSM windows from the same stream as the GSM phase."""
    from evalpipe.data import longctx

    probe_spec = longctx.LongCtxSpec(value_digits=spec["longctx_value_digits"])
    losses: list[float] = []
    for k, stage in enumerate(spec["longctx_stages"]):
        plan = _longctx_schedule(spec, stage)
        per_step = {n: max(1, stage["tokens_per_step"] // n) for n in stage["lengths"]}
        need = {n: sum(per_step[n] for kind, m in plan if kind == "probe" and m == n) for n in stage["lengths"]}
        pool: dict[int, list[tuple[str, str]]] = {}
        for n, count in need.items():
            by_probe = [longctx.training_pairs(p, tok, -(-count // len(stage["probes"])), [n],
                                               seed=spec["longctx_seed"] + k, spec=probe_spec)
                        for p in stage["probes"]]
            pool[n] = [pair for group in zip(*by_probe) for pair in group]  # interleave probes
        n_gsm = sum(1 for kind, _ in plan if kind == "gsm")
        gsm_ids, gsm_labels = _windows(spec, tok, corpus, n_gsm * spec["batch_size"]) if n_gsm else (None, None)
        say(f"[{time.monotonic() - t0:5.1f}s] long-context stage {k + 1}: {stage['steps']} steps, "
            f"lengths {stage['lengths']}, {sum(need.values())} probe prompts, {n_gsm} GSM batches")
        opt = _optimizer(model, spec, stage["lr"])
        sched = {"lr": stage["lr"], "warmup_steps": max(1, stage["steps"] // 10), "steps": stage["steps"],
                 "min_lr_ratio": spec["min_lr_ratio"]}
        used = {n: 0 for n in stage["lengths"]}
        g = 0
        for step, (kind, n) in enumerate(plan):
            if kind == "gsm":
                assert gsm_ids is not None and gsm_labels is not None  # a "gsm" step in the plan made n_gsm > 0
                B = spec["batch_size"]
                x, y = gsm_ids[g * B:(g + 1) * B], gsm_labels[g * B:(g + 1) * B]
                g += 1
            else:
                x, y = _answer_windows(tok, pool[n][used[n]:used[n] + per_step[n]])
                used[n] += per_step[n]
            losses.append(_train_step(model, opt, x, y, _lr_at(step, sched), spec["grad_clip"]))
        say(f"[{time.monotonic() - t0:5.1f}s] long-context stage {k + 1} done, last loss {losses[-1]:.4f}")
    return losses


# ----------------------------------------------------------------------------- build


@contextlib.contextmanager
def _torch_threads(n: int):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _add_legacy_config_keys(path: Path, spec: dict[str, Any]) -> None:
    """Also spell rope theta and dtype the way transformers 4.x (older engines) read them."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg.setdefault("rope_theta", float(spec["rope_theta"]))
    cfg.setdefault("torch_dtype", "float32")
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _lr_at(step: int, spec: dict[str, Any]) -> float:
    peak, warm, total = spec["lr"], spec["warmup_steps"], spec["steps"]
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    lo = peak * spec["min_lr_ratio"]
    return lo + (peak - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def _optimizer(model, spec: dict[str, Any], lr: float):
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=tuple(spec["adam_betas"]), eps=1e-8,
    )


def _train_step(model, opt, x, y, lr: float, grad_clip: float) -> float:
    import torch

    for g in opt.param_groups:
        g["lr"] = lr
    logits = model(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return float(loss.detach())


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _machine() -> dict[str, Any]:
    """The CPU and software a build ran on (training results depend on them)."""
    import platform

    from evalpipe.machine import describe

    hw = describe()
    return {"cpu": hw["cpu"], "isa": hw["isa"], "machine": hw["machine"], "cores": hw["cpus"],
            "python": platform.python_version()}


def _build_into(out: Path, name: str, spec: dict[str, Any], say: Progress) -> dict[str, Any]:
    t0 = time.monotonic()
    import itertools

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from evalpipe.data import gsm_synth

    out.mkdir(parents=True, exist_ok=True)
    corpus = gsm_synth.training_corpus(seed=spec["corpus_seed"])
    tok_texts = [gsm_synth.format_example(d) for d in itertools.islice(corpus, spec["tokenizer_items"])]
    tok = train_tokenizer(spec, tok_texts)
    say(f"[{time.monotonic() - t0:5.1f}s] tokenizer: vocab {tok.get_vocab_size()}")

    n_windows = spec["steps"] * spec["batch_size"]
    ids, labels = _windows(spec, tok, corpus, n_windows)
    n_trained = int((labels != -100).sum())
    say(f"[{time.monotonic() - t0:5.1f}s] data: {n_windows} windows x {spec['seq_len']} tokens, "
        f"{n_trained} trained positions")

    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        head_dim=spec["head_dim"],
        max_position_embeddings=spec["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": float(spec["rope_theta"])},
        rms_norm_eps=spec["rms_norm_eps"],
        tie_word_embeddings=spec["tie_word_embeddings"],
        initializer_range=spec["initializer_range"],
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=tok.token_to_id(PAD),
        # transformers 5 takes torch_dtype (its old name of dtype) through **kwargs, which its typed signature leaves out;
        # kept rather than dtype= because older transformers 4 releases, which a vLLM build may bring, know only torch_dtype
        torch_dtype="float32",  # type: ignore[call-arg]
    )
    losses: list[float] = []
    with _torch_threads(spec["torch_threads"]):
        torch.manual_seed(spec["seed"])
        # transformers declares to() with functools.wraps(nn.Module.to): the checker sees the unbound method's signature
        model = LlamaForCausalLM(cfg).to(torch.float32)  # type: ignore[arg-type]
        n_params = sum(p.numel() for p in model.parameters())
        say(f"[{time.monotonic() - t0:5.1f}s] model: {n_params / 1e6:.2f}M parameters")
        opt = _optimizer(model, spec, spec["lr"])
        model.train()
        B, steps = spec["batch_size"], spec["steps"]
        report_every = max(1, steps // 10)
        t_train = time.monotonic()
        for step in range(steps):
            x = ids[step * B:(step + 1) * B]
            y = labels[step * B:(step + 1) * B]
            losses.append(_train_step(model, opt, x, y, _lr_at(step, spec), spec["grad_clip"]))
            if (step + 1) % report_every == 0 or step + 1 == steps:
                recent = losses[-report_every:]
                say(f"[{time.monotonic() - t0:5.1f}s] step {step + 1}/{steps} "
                    f"loss {sum(recent) / len(recent):.4f} lr {_lr_at(step, spec):.2e} "
                    f"({(time.monotonic() - t_train) / (step + 1):.2f}s/step)")
        lc_losses = _train_longctx(model, spec, tok, corpus, say, t0) if spec["longctx_stages"] else []
        model.eval()
        model.save_pretrained(str(out))
    _add_legacy_config_keys(out / "config.json", spec)
    GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    ).save_pretrained(str(out))
    _save_tokenizer(tok, out, model_max_length=spec["max_position_embeddings"])

    tail = losses[-max(1, len(losses) // 20):]
    info = {
        "name": name,
        "spec": spec,
        "spec_hash": spec_hash(name, spec),
        "fingerprint": fingerprint_dir(out),
        "fingerprint_files": [f for f in FINGERPRINT_FILES if (out / f).exists()],
        "files": {f: _file_sha256(out / f) for f in FINGERPRINT_FILES if (out / f).exists()},
        "built_on": _machine(),
        "n_params": n_params,
        "build_seconds": round(time.monotonic() - t0, 2),
        "torch_version": torch.__version__,
        "transformers_version": _version("transformers"),
        "final_loss": round(losses[-1], 6),
        "final_loss_mean_tail": round(sum(tail) / len(tail), 6),
        "longctx_final_loss": round(lc_losses[-1], 6) if lc_losses else None,
    }
    from evalpipe.artifacts import write_json

    write_json(out / INFO_FILE, info)
    say(f"[{info['build_seconds']:5.1f}s] saved {name} ({info['fingerprint'][:12]})")
    return info
