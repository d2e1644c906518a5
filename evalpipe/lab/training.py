"""Training the built-in models from their recipes (evalpipe.models.builtin holds the
recipes and serves the shipped files; this is the lab that makes them).

:func:`build` trains into the cache (or a given directory): a spec-hashed directory,
built in a temporary directory and renamed into place under a file lock. :func:`ship`
replaces a model's shipped files (``python -m evalpipe.lab.build NAME --ship``).
Heavy imports (torch, transformers, tokenizers) happen inside functions, so importing
this module stays cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import math
import os
import platform
import random
import shutil
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from evalpipe.data import gsm_synth, longctx
from evalpipe.errors import UserError
from evalpipe.machine import describe
from evalpipe.models.builtin import (
    BOS,
    EOS,
    FINGERPRINT_FILES,
    INFO_FILE,
    PAD,
    SPECIAL_TOKENS,
    UNK,
    BuildMachine,
    BuiltModel,
    ModelInfo,
    Progress,
    check_name,
    default_path,
    file_sha256,
    fingerprint_dir,
    load_built,
    model_spec,
    shipped_path,
    spec_hash,
)
from evalpipe.rundir.artifacts import write_json


def ship(name: str, progress: Progress | None = None) -> BuiltModel:
    """Train ``name`` from its recipe and replace its shipped files (the maintainers' step
    after a recipe change: ``python -m evalpipe.lab.build NAME --ship``)."""
    name = check_name(name)
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
    name = check_name(name)
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
    return BuiltModel(path=target, fingerprint=info.fingerprint, info=info)


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

    import torch


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
            ex = gsm_synth.format_example(next(corpus))
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
    import torch

    n = len(tid)
    ids[i, :n] = torch.from_numpy(tid)
    labels[i, : n - 1] = torch.from_numpy(np.where(train, tid, -100)[1:])


def _answer_windows(tok, pairs: list[tuple[str, str]]):
    """One padded batch of ``prompt + " " + answer + "\\n"``; loss on the answer and the newline."""
    import torch


    encs = tok.encode_batch([p + longctx.TARGET_DELIMITER + a + longctx.STOP for p, a in pairs])
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

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _machine() -> dict[str, Any]:
    """The CPU and software a build ran on (training results depend on them)."""


    hw = describe()
    return {"cpu": hw["cpu"], "isa": hw["isa"], "machine": hw["machine"], "cores": hw["cpus"],
            "python": platform.python_version()}


def _model_config(spec: dict[str, Any], tok) -> tuple[Any, Any]:
    """The transformers config and model class of the spec's ``arch``; what every
    architecture shares (vocabulary, special tokens, width, rope) is set here once."""
    common = {
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": spec["hidden_size"],
        "intermediate_size": spec["intermediate_size"],
        "num_hidden_layers": spec["num_hidden_layers"],
        "num_attention_heads": spec["num_attention_heads"],
        "num_key_value_heads": spec["num_key_value_heads"],
        "max_position_embeddings": spec["max_position_embeddings"],
        "rope_parameters": {"rope_type": "default", "rope_theta": float(spec["rope_theta"])},
        "rms_norm_eps": spec["rms_norm_eps"],
        "tie_word_embeddings": spec["tie_word_embeddings"],
        "initializer_range": spec["initializer_range"],
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": tok.token_to_id(EOS),
        "pad_token_id": tok.token_to_id(PAD),
        # transformers 5 takes torch_dtype (its old name of dtype) through **kwargs; kept rather than
        # dtype= because older transformers 4 releases, which a vLLM build may bring, know only torch_dtype
        "torch_dtype": "float32",
    }
    arch = spec["arch"]
    if arch not in _ARCHITECTURES:
        raise UserError(f"unknown arch {arch!r} in the recipe; known: {', '.join(sorted(_ARCHITECTURES))}")
    return _ARCHITECTURES[arch](spec, common)


def _llama(spec: dict[str, Any], common: dict[str, Any]) -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaConfig(**common, head_dim=spec["head_dim"]), LlamaForCausalLM


def _deepseek_v3(spec: dict[str, Any], common: dict[str, Any]) -> tuple[Any, Any]:
    """MLA attention and a routed MoE. ``topk_method`` and ``scoring_func`` are not
    transformers fields (its router is always the aux-free sigmoid one); they go into
    config.json because vLLM's DeepSeek loader reads them to expect the
    ``e_score_correction_bias`` of every MoE gate."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    keys = ("moe_intermediate_size", "first_k_dense_replace", "n_routed_experts", "n_shared_experts",
            "num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor",
            "topk_method", "scoring_func", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
            "qk_nope_head_dim", "v_head_dim", "rope_interleave", "hidden_act")
    return DeepseekV3Config(**common, **{k: spec[k] for k in keys}, num_mtp_layers=0), DeepseekV3ForCausalLM


# spec["arch"] -> (spec, shared config fields) -> (transformers config, model class)
_ARCHITECTURES: dict[str, Callable[[dict[str, Any], dict[str, Any]], tuple[Any, Any]]] = {
    "llama": _llama,
    "deepseek_v3": _deepseek_v3,
}


def _build_into(out: Path, name: str, spec: dict[str, Any], say: Progress) -> ModelInfo:
    t0 = time.monotonic()

    import torch
    from transformers import GenerationConfig


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

    cfg, model_class = _model_config(spec, tok)
    losses: list[float] = []
    with _torch_threads(spec["torch_threads"]):
        torch.manual_seed(spec["seed"])
        # transformers declares to() with functools.wraps(nn.Module.to): the checker sees the unbound method's signature
        model = model_class(cfg).to(torch.float32)
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
    info = ModelInfo(
        name=name,
        spec=spec,
        spec_hash=spec_hash(name, spec),
        fingerprint=fingerprint_dir(out),
        fingerprint_files=[f for f in FINGERPRINT_FILES if (out / f).exists()],
        files={f: file_sha256(out / f) or "" for f in FINGERPRINT_FILES if (out / f).exists()},
        built_on=BuildMachine(**_machine()),
        n_params=n_params,
        build_seconds=round(time.monotonic() - t0, 2),
        torch_version=str(torch.__version__),
        transformers_version=_version("transformers"),
        final_loss=round(losses[-1], 6),
        final_loss_mean_tail=round(sum(tail) / len(tail), 6),
        longctx_final_loss=round(lc_losses[-1], 6) if lc_losses else None,
    )
    write_json(out / INFO_FILE, info.model_dump(mode="json"))
    say(f"[{info.build_seconds:5.1f}s] saved {name} ({info.fingerprint[:12]})")
    return info
