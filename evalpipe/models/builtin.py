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

``tiny-moe`` is the same training (tokenizer, data, both phases) for a DeepSeek-V3
model, MLA attention and a routed mixture of experts, shaped for vLLM's CPU DeepSeek
layer at tensor and expert parallel sizes above 1 (notes above ``_tiny_moe_spec``).

A build is deterministic on one machine: a fixed seed, a fixed torch thread count and a
fixed data stream give byte-identical ``model.safetensors`` and tokenizer files on the
same CPU kind and torch version. Across CPUs it is not (the same recipe scored 0.595
strict-match when built on one x86 CPU and 0.482 on another, the AMD EPYC with AVX-512
that built the shipped files: the vectorised float kernels round differently and 600
training steps amplify it). So the trained files ship inside the
package (``shipped/<name>/``, with the spec hash, per-file sha256 and the machine they
were built on in ``evalpipe-model.json``), and runs serve those (:func:`ensure_builtin`);
``python -m evalpipe.lab.build NAME --ship`` regenerates them after a recipe change.
The training itself is in the lab (:mod:`evalpipe.lab.training`): this module holds
the recipes, names and fingerprints, and serves the shipped files.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Final, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from evalpipe.data import gsm_synth, longctx
from evalpipe.errors import UserError
from evalpipe.paths import models_dir
from evalpipe.validation import first_problem

Progress = Callable[[str], None]

BUILTIN_PREFIX = "builtin:"
INFO_FILE = "evalpipe-model.json"
MODEL_INFO_VERSION: Final = 1
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
REGENERATE = "python -m evalpipe.lab.build {name} --ship"

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


# Recipe notes for tiny-moe (same machine, torch and measures as tiny-gsm's notes). The
# shape is fixed by vLLM 0.32's CPU DeepSeek layer, not chosen for scores: its MLA decode
# kernel takes head size 576 only (kv_lora_rank 512 + qk_rope_head_dim 64); its loader
# wants each MoE gate's e_score_correction_bias, which it expects only with
# topk_method "noaux_tc" and scoring_func "sigmoid" in config.json (transformers' router
# is always that one and saves the buffer); 4 heads and 8 experts split over tensor
# parallel 2 and expert parallel 4; vLLM's DeepSeek model has its own lm_head (no tied
# embeddings). qk_nope/v widths 32, q_lora_rank None (a plain q_proj), dense first layer.
# Tried first, at hidden 128 / intermediate 384 (2.22 M parameters) with tiny-gsm's schedule
# unchanged (300 GSM steps at lr 4e-3, then its long-context phase): GSM answer loss 0.76 at
# the end of the phase (tiny-gsm: 0.19), strict-match 0.00 (0/50, vLLM TP 1 fp32): the answers
# kept the format and the steps but copied and computed the numbers wrong.
# Shipped: hidden 192, intermediate 512, everything else the same (3.20 M parameters),
# final loss 0.35 (`python -m evalpipe.lab.build tiny-moe --set hidden_size=192 --set
# intermediate_size=512 --out-dir DIR` before it became the recipe): strict-match 0.28 (14/50,
# vLLM TP 1 fp32, native rotary), passkey 2/3, multikey 0/3, vartrack 0/3 at 2047-2049 tokens.
# Speed on the 2-core AMD EPYC: 0.57 s per GSM step and 7 min 09 s for the whole build on an
# idle machine; the shipped build took 47 min (2841 s recorded) with two other jobs running
# tests on the cores (GSM phase 1065 s, long-context stages 1520 s and 250 s).
def _tiny_moe_spec() -> dict[str, Any]:
    spec = _tiny_gsm_spec()  # same tokenizer, data and long-context recipe: prompts tokenize alike
    del spec["head_dim"]  # MLA sets its own head sizes
    spec.update({
        "arch": "deepseek_v3",
        # model: shaped for vLLM's DeepSeek-V2/V3 layer on CPU at TP 2 x EP 4 (see the notes)
        "hidden_size": 192,
        "intermediate_size": 512,  # the dense MLP of the first layer
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,  # vLLM's DeepSeek model always loads its own lm_head
        "hidden_act": "silu",
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "rope_interleave": True,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": 128,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
    })
    return spec


# name -> factory of the default spec (a factory keeps module import light)
BUILTIN_MODELS: dict[str, Callable[[], dict[str, Any]]] = {
    "tiny-gsm": _tiny_gsm_spec,
    "tiny-moe": _tiny_moe_spec,
}


class BuildMachine(BaseModel):
    """The CPU and software a build ran on (training results depend on them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: str
    isa: list[str]
    machine: str
    cores: int
    python: str


class ModelInfo(BaseModel):
    """evalpipe-model.json: what a build of a built-in model records (written by the lab's
    training, read here to serve and verify the files). Version 1 is the first typed one;
    the version-less files before it, the shipped ones among them, had the same fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = MODEL_INFO_VERSION
    name: str
    spec: dict[str, Any]
    spec_hash: str
    fingerprint: str
    fingerprint_files: list[str]
    files: dict[str, str]  # file name -> sha256, the fingerprinted files
    built_on: BuildMachine
    n_params: int
    build_seconds: float
    torch_version: str
    transformers_version: str | None = None
    final_loss: float
    final_loss_mean_tail: float
    longctx_final_loss: float | None = None


@dataclass
class BuiltModel:
    path: Path
    fingerprint: str
    info: ModelInfo

    @property
    def name(self) -> str:
        return self.info.name


# ----------------------------------------------------------------------------- names & specs


def is_builtin(spec: str) -> bool:
    """True for model strings like ``builtin:tiny-gsm``."""
    return isinstance(spec, str) and spec.startswith(BUILTIN_PREFIX)


def builtin_name(spec: str) -> str:
    """``builtin:tiny-gsm`` -> ``tiny-gsm`` (a bare name passes through)."""
    return spec[len(BUILTIN_PREFIX):] if is_builtin(spec) else spec


def check_name(name: str) -> str:
    name = builtin_name(name)
    if name not in BUILTIN_MODELS:
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise UserError(f"unknown built-in model {name!r}; known built-in models: {known}")
    return name


def model_spec(name: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    name = check_name(name)
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
    name = check_name(name)
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
    remedy = f"restore it (git checkout -- {info_path}) or rebuild the model: {REGENERATE.format(name='NAME')}"
    try:
        raw = json.loads(info_path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ShippedModelError(f"{info_path} is not JSON ({err}); {remedy}") from None
    if isinstance(raw, dict):
        raw.setdefault("version", MODEL_INFO_VERSION)  # before the typed file: the same fields
    try:
        info = ModelInfo.model_validate(raw)
    except ValidationError as err:
        key, what = first_problem(err)
        raise ShippedModelError(f"{info_path}: {key or 'the file'}: {what}; {remedy}") from None
    return BuiltModel(path=path, fingerprint=info.fingerprint, info=info)


# ----------------------------------------------------------------------------- public entry points


class ShippedModelError(UserError):
    """The shipped files of a built-in model are missing, altered or from another recipe."""


def shipped_path(name: str) -> Path:
    return SHIPPED_DIR / check_name(name)


def ensure_builtin(name: str, progress: Progress | None = None) -> BuiltModel:
    """The shipped model for ``name`` (e.g. ``tiny-gsm`` or ``builtin:tiny-gsm``), verified.

    Checks that the shipped files were built from the recipe in this module (spec hash)
    and that every file still has the sha256 recorded at build time, so a run never
    serves a model other than the one its fingerprint names.
    """
    name = check_name(name)
    path = shipped_path(name)
    model = load_built(path)
    if model is None:
        raise ShippedModelError(
            f"the shipped files of built-in model {name!r} are missing ({path / INFO_FILE}); "
            f"restore them from the repository (git checkout -- {path}) or rebuild them: {REGENERATE.format(name=name)}")
    want = spec_hash(name, model_spec(name))
    if model.info.spec_hash != want:
        raise ShippedModelError(
            f"the shipped {name} in {path} was built from another recipe (spec hash "
            f"{model.info.spec_hash}, evalpipe/models/builtin.py now gives {want}); "
            f"rebuild the shipped files: {REGENERATE.format(name=name)}")
    # The build recorded the fingerprint and these per-file digests from the same bytes,
    # so every fingerprinted file matching its digest is the fingerprint check: each file
    # is read once, and a mismatch names the file.
    files = model.info.files
    if sorted(files) != sorted(f for f in FINGERPRINT_FILES if (path / f).exists()) or not files:
        raise ShippedModelError(f"{path / INFO_FILE} does not list a sha256 for every model file; "
                                f"restore the directory from the repository: git checkout -- {path}")
    for fname, digest in files.items():
        if file_sha256(path / fname) != digest:
            raise ShippedModelError(
                f"shipped file {path / fname} does not match its recorded sha256 (altered or truncated); "
                f"restore it from the repository: git checkout -- {path}")
    if progress:
        progress(f"shipped {name}, fingerprint {model.fingerprint[:12]}")
    return model


def file_sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.sha256()
    _hash_into(h, path)
    return h.hexdigest()
