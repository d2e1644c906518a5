"""Long-context probe generator (evalpipe/data/longctx.py) and its lm-eval tasks; no engine.

Tokenizers: the built-in model's (shipped with the package) and tokenizers built here
with the `tokenizers` library:
a byte-level BPE (GPT-2 style), a Metaspace BPE (SentencePiece style: pieces cost
differently standalone and in context) and a BPE without pre-tokenizer (merges across
words and sentences: token counts do not add up, exercising the measured search).
"""

from __future__ import annotations

import json
import random
import re

import pytest
import yaml
from checkout import ROOT
from pydantic import ValidationError

from evalpipe.data import longctx as lc
from evalpipe.errors import UserError

TASKS = ROOT / "tasks" / "longctx"

# Small but complete: round lengths, all edge kinds (511, 512, 513, 515, 527).
SMALL = lc.LongCtxSpec(lengths=(512, 1024), sparse_block=512, items_per_length=3)


def _corpus() -> list[str]:
    r = random.Random(0)
    out = []
    for _ in range(300):
        filler = " ".join(r.choice(lc.FILLER).strip() for _ in range(5))
        out.append(
            f"{filler} The pass key is {r.randint(10_000, 99_999)}. VAR ABCDE = VAR QWERT. "
            f"The value of key lemon-42 is 5832. What is the pass key? - - ."
        )
    return out


def _wrap(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _train(kind: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<unk>", "<s>", "</s>"]
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    elif kind == "metaspace":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
        alphabet = list(lc.FILLER[0] + "\n-.,*?=" + "0123456789" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    else:  # "nopretok": whole text is one pre-token, merges cross words and sentences
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        alphabet = list("\n-.,*?=" + "0123456789" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return _wrap(tok)


@pytest.fixture(scope="module")
def builtin_tok(builtin_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(builtin_model_dir))


@pytest.fixture(scope="module", params=["bytelevel", "metaspace"])
def small_tok(request):
    return _train(request.param)


@pytest.fixture(scope="module")
def bpe_tok():
    return _train("bytelevel")


@pytest.fixture(scope="module")
def default_items(builtin_tok):
    """The default spec's items for every probe under the built-in tokenizer."""
    return {p: lc.generate(p, builtin_tok) for p in lc.PROBES}


def _n(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


# ----------------------------------------------------------------------------- lengths


def test_default_target_lengths():
    assert lc.target_lengths(lc.LongCtxSpec()) == [
        (2047, "edge", ["block-1"]),
        (2048, "round", ["tp4:0", "tp16:0", "block"]),
        (2049, "edge", ["tp4:1", "tp16:1", "block+1"]),
        (2051, "edge", ["tp4:3"]),
        (2063, "edge", ["tp16:15"]),
        (4096, "round", []),
        (8192, "round", []),
        (16384, "round", []),
    ]


@pytest.mark.parametrize("bases,tps,block", [((1000, 3001), (3, 8, 1, 2), 700), ((4096,), (16,), 4096)])
def test_edge_lengths_have_the_right_residues(bases, tps, block):
    spec = lc.LongCtxSpec(lengths=(5000,), edge_bases=bases, tp_sizes=tps, sparse_block=block)
    targets = lc.target_lengths(spec)
    assert [n for n, _, _ in targets] == sorted({n for n, _, _ in targets})  # sorted, de-duplicated
    by_len = {n: tags for n, _, tags in targets}
    for b in bases:
        for t in tps:
            for r in {0, 1 % t, (t - 1) % t}:
                n = min(n for n in by_len if n >= b and n % t == r)  # the smallest such count ...
                assert f"tp{t}:{r}" in by_len[n]  # ... is present and tagged
    for n, tags in by_len.items():
        for tag in tags:
            if tag.startswith("tp"):
                t, r = map(int, tag[2:].split(":"))
                assert n % t == r and r in {0, 1 % t, (t - 1) % t}
    assert "block-1" in by_len[block - 1] and "block" in by_len[block] and "block+1" in by_len[block + 1]
    assert all(kind == ("round" if n == 5000 else "edge") for n, kind, _ in targets)


def _check_lengths(items: list[dict], tok, spec: lc.LongCtxSpec) -> None:
    targets = lc.target_lengths(spec)
    for it in items:
        assert it["length"] == it["target_length"] == _n(tok, it["prompt"]), it["id"]
    assert [it["target_length"] for it in items] == [n for n, _, _ in targets for _ in range(spec.items_per_length)]
    meta = {n: (kind, tags) for n, kind, tags in targets}
    assert all((it["length_kind"], it["length_tags"]) == meta[it["target_length"]] for it in items)
    assert [it["doc_id"] for it in items] == list(range(len(items)))
    assert len({it["id"] for it in items}) == len(items)


@pytest.mark.parametrize("probe", lc.PROBES)
def test_default_spec_exact_lengths_builtin(default_items, builtin_tok, probe):
    _check_lengths(default_items[probe], builtin_tok, lc.LongCtxSpec())


@pytest.mark.parametrize("probe", lc.PROBES)
def test_small_spec_exact_lengths(small_tok, probe):
    _check_lengths(lc.generate(probe, small_tok, SMALL), small_tok, SMALL)


def test_exact_lengths_when_tokens_merge_across_sentences():
    tok = _train("nopretok")
    spec = lc.LongCtxSpec(lengths=(512,), sparse_block=512, tp_sizes=(4,), items_per_length=1)
    for probe in ("passkey", "multikey"):
        _check_lengths(lc.generate(probe, tok, spec), tok, spec)


def test_length_too_small_for_the_tokenizer_is_one_clear_error(bpe_tok):
    spec = lc.LongCtxSpec(lengths=(64,), sparse_block=512, n_chains=3, chain_len=4)
    with pytest.raises(UserError, match=r"^target length 64 cannot hold the vartrack header, needles and question \(\d+ tokens under this tokenizer\); use longer lengths or fewer keys/chains\.$"):
        lc.generate("vartrack", bpe_tok, spec)


# ----------------------------------------------------------------------------- content


def _needle_start(it: dict) -> int:
    """Character where the asked needle (vartrack: first link) starts, found from the text."""
    p, a = it["prompt"], it["answer"]
    if it["probe"] == "passkey":
        needle = f" The pass key is {a}."
    elif it["probe"] == "multikey":
        key = re.search(r"What is the value of key (\S+)\?", p)[1]
        needle = f" The value of key {key} is {a}."
    else:
        needle = f" VAR {a.split(lc.VAR_SEPARATOR)[0]} = "
    assert p.count(needle) == 1, needle
    return p.index(needle)


def _check_depths(items: list[dict], tok) -> None:
    meter = lc._Meter(tok)
    unit = max(meter.cost(s) for s in lc.FILLER)  # one filler sentence
    for it in items:
        p, length = it["prompt"], it["length"]
        found = list(re.finditer(r" The pass key is \d+\. Remember it\.| The value of key \S+ is \d+\.| VAR \w+ = [^.]+\.", p))
        slack = unit + max(meter.cost(m[0]) for m in found)
        start = _needle_start(it)
        pos = _n(tok, p[:start])
        assert it["needle_pos"] == pos and it["depth"] == pos / length, it["id"]
        # Within one filler sentence (+ one needle) of its target depth, unless the other
        # needles leave no room there (many needles in a short prompt).
        before = _n(tok, lc.HEADER[it["probe"]]) + sum(meter.cost(m[0]) for m in found if m.start() < start)
        after = sum(meter.cost(m[0]) for m in found if m.start() > start)
        latest = length - meter.cost("\n" + p.rsplit("\n", 1)[1]) - it["pad_tokens"] - after
        want = max(before, min(it["target_depth"] * length, latest))
        assert abs(pos - want) <= slack, (it["id"], pos, it["target_depth"], want)
        if it["probe"] == "vartrack":
            names = it["answer"].split(lc.VAR_SEPARATOR)
            starts = [_n(tok, it["prompt"][: it["prompt"].index(f" VAR {n} = ")]) for n in names]
            assert it["chain_pos"] == starts and starts == sorted(starts)


def _check_answers(items: list[dict], spec: lc.LongCtxSpec) -> None:
    for it in items:
        p, a = it["prompt"], it["answer"]
        body, question = p.rsplit("\n", 1)
        if it["probe"] == "passkey":
            assert re.findall(r"\d+", body) == [a] and question == "What is the pass key? The pass key is"
        elif it["probe"] == "multikey":
            pairs = re.findall(r" The value of key (\S+) is (\d+)\.", body)
            keys, values = [k for k, _ in pairs], [v for _, v in pairs]
            assert len(pairs) == spec.n_keys
            assert len(set(keys)) == len(keys) and len(set(values)) == len(values)  # distractors differ
            key = re.fullmatch(r"What is the value of key (\S+)\? The value of key \1 is", question)[1]
            assert dict(pairs)[key] == a and re.findall(r"\d{5}", body).count(a) == 1
        else:
            # Resolve every assignment in the text; the names bound to the asked value,
            # in the order they appear, must be exactly the answer.
            value = re.fullmatch(r"Which variables are assigned the value (\d+)\? The variables are", question)[1]
            assigns = re.findall(r" VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d+)\.", body)
            names = [n for n, _ in assigns]
            assert len(set(names)) == len(names)
            bound: dict[str, str] = {}
            for name, rhs in assigns:
                bound[name] = bound[rhs[4:]] if rhs.startswith("VAR ") else rhs  # refers to an earlier name
            assert [n for n in names if bound[n] == value] == a.split(lc.VAR_SEPARATOR)
            assert len(a.split(lc.VAR_SEPARATOR)) == spec.chain_len
            assert sum(v == value for v in bound.values()) == len(a.split(lc.VAR_SEPARATOR))
            assert len(set(bound.values())) == spec.n_chains  # distractor chains: other values


@pytest.mark.parametrize("probe", lc.PROBES)
def test_builtin_needles_and_answers(default_items, builtin_tok, probe):
    items = default_items[probe]
    _check_depths(items, builtin_tok)
    _check_answers(items, lc.LongCtxSpec())


@pytest.mark.parametrize("probe", lc.PROBES)
def test_small_needles_and_answers(small_tok, probe):
    items = lc.generate(probe, small_tok, SMALL)
    _check_depths(items, small_tok)
    _check_answers(items, SMALL)


def test_depths_cycle_and_haystacks_are_shared(bpe_tok):
    spec = SMALL
    for probe in lc.PROBES:
        items = lc.generate(probe, bpe_tok, spec)
        assert [it["target_depth"] for it in items] == [spec.depths[i % len(spec.depths)] for i in range(len(items))]
        groups: dict[str, list[dict]] = {}
        for it in items:
            groups.setdefault(it["haystack_id"], []).append(it)
        per = 1 if probe == "passkey" else spec.questions_per_haystack
        assert max(len(g) for g in groups.values()) == per
        for g in groups.values():
            # one haystack: the same text up to the pad units before the question
            stems = set()
            for it in g:
                question = "\n" + it["prompt"].rsplit("\n", 1)[1]
                pad = it["pad_unit"] * it["pad_tokens"]
                assert it["prompt"].endswith(pad + question)
                stems.add(it["prompt"][: len(it["prompt"]) - len(pad + question)])
            assert len(stems) == 1 and len({it["answer"] for it in g}) == len(g)


def test_answers_fit_the_generation_budget(default_items, builtin_tok):
    for probe, items in default_items.items():
        cfg = yaml.safe_load((TASKS / f"longctx_{probe}.yaml").read_text())
        assert cfg["generation_kwargs"]["max_gen_toks"] == lc.MAX_GEN_TOKS[probe]
        assert cfg["generation_kwargs"]["until"] == [lc.STOP]
        for it in items:
            assert _n(builtin_tok, lc.TARGET_DELIMITER + it["answer"] + lc.STOP) <= lc.MAX_GEN_TOKS[probe]


# ----------------------------------------------------------------------------- determinism, files


def _dump(items: list[dict]) -> str:
    return "".join(json.dumps(it, sort_keys=True, ensure_ascii=False) + "\n" for it in items)


def test_generation_is_deterministic(default_items, builtin_tok):
    for probe in lc.PROBES:
        assert _dump(lc.generate(probe, builtin_tok)) == _dump(default_items[probe])


def test_write_probe_is_deterministic_and_idempotent(bpe_tok, tmp_path, monkeypatch):
    spec = lc.LongCtxSpec(lengths=(512,), sparse_block=512, tp_sizes=(4,), items_per_length=2)
    a = lc.write_probe("multikey", bpe_tok, spec, tmp_path / "a")
    b = lc.write_probe("multikey", bpe_tok, spec, tmp_path / "b")
    fp = lc.fingerprint("multikey", spec, bpe_tok)
    assert a == tmp_path / "a" / "longctx" / f"multikey-{fp[:12]}" / "test.jsonl"
    for name in ("test.jsonl", "meta.json"):
        assert (a.parent / name).read_bytes() == (b.parent / name).read_bytes()
    meta = json.loads((a.parent / "meta.json").read_text())
    assert meta["fingerprint"] == fp and meta["n_items"] == 8 and meta["counts_per_length"] == {"511": 2, "512": 2, "513": 2, "515": 2}
    assert meta["spec"]["edge_bases"] == [512]
    # an intact copy is reused without generating ...
    monkeypatch.setattr(lc, "generate", lambda *a, **k: pytest.fail("regenerated an intact set"))
    assert lc.write_probe("multikey", bpe_tok, spec, tmp_path / "a") == a
    monkeypatch.undo()
    # ... a damaged one is rewritten
    a.write_text(a.read_text().replace("The", "Teh", 1))
    lc.write_probe("multikey", bpe_tok, spec, tmp_path / "a")
    assert a.read_bytes() == b.read_bytes()
    assert not [p for p in a.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_fingerprint_tracks_spec_probe_and_tokenizer(bpe_tok):
    spec = lc.LongCtxSpec()
    fp = lc.fingerprint("passkey", spec, bpe_tok)
    assert fp == lc.fingerprint("passkey", lc.LongCtxSpec(), _train("bytelevel"))  # same content, new object
    assert fp == lc.fingerprint("passkey", lc.LongCtxSpec(edge_bases=(2048,)), bpe_tok)  # same resolved spec
    others = {
        lc.fingerprint("multikey", spec, bpe_tok),
        lc.fingerprint("passkey", lc.LongCtxSpec(seed=1), bpe_tok),
        lc.fingerprint("passkey", lc.LongCtxSpec(lengths=(4096,)), bpe_tok),
        lc.fingerprint("passkey", lc.LongCtxSpec(tp_sizes=(8,)), bpe_tok),
        lc.fingerprint("passkey", spec, _train("metaspace")),
    }
    assert fp not in others and len(others) == 5
    bpe_tok.encode("x " * 10, add_special_tokens=False)  # using the tokenizer does not change it
    assert lc.fingerprint("passkey", spec, bpe_tok) == fp


def test_fingerprint_of_builtin_tokenizer_is_stable(builtin_tok, builtin_model_dir):
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(str(builtin_model_dir))
    assert lc.fingerprint("vartrack", lc.LongCtxSpec(), builtin_tok) == lc.fingerprint("vartrack", lc.LongCtxSpec(), again)


@pytest.mark.parametrize("digits", [2, 5])
def test_values_have_the_configured_number_of_digits(builtin_tok, digits):
    spec = lc.LongCtxSpec(lengths=(512,), sparse_block=512, tp_sizes=(4,), items_per_length=3, value_digits=digits)
    for probe in ("passkey", "multikey", "vartrack"):
        for it in lc.generate(probe, builtin_tok, spec):
            value = it["answer"] if probe != "vartrack" else re.search(r"assigned the value (\d+)\?", it["prompt"]).group(1)
            assert re.fullmatch(rf"[1-9]\d{{{digits - 1}}}", value), (probe, value)
            assert _n(builtin_tok, it["prompt"]) == it["target_length"]


def test_raw_tokenizers_object_gives_the_same_items(bpe_tok):
    spec = lc.LongCtxSpec(lengths=(512,), sparse_block=512, tp_sizes=(4,), items_per_length=2)
    raw = bpe_tok.backend_tokenizer
    assert _dump(lc.generate("passkey", raw, spec)) == _dump(lc.generate("passkey", bpe_tok, spec))
    assert lc.fingerprint("passkey", spec, raw) == lc.fingerprint("passkey", spec, bpe_tok)


# ----------------------------------------------------------------------------- spec validation


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"lengths": ()}, "`lengths` is empty; give at least one length."),
        ({"lengths": (32,)}, "length 32 is too small to hold a probe; use lengths of at least 64 tokens."),
        ({"tp_sizes": (4, 0)}, "tp size 0 is invalid; every tp size must be at least 1."),
        ({"sparse_block": 16}, "sparse_block 16 is too small; it must be at least 65 so that sparse_block-1 holds a probe."),
        ({"items_per_length": 0}, "items_per_length is 0; it must be at least 1."),
        ({"depths": (0.5, 1.5)}, "depths [0.5, 1.5] are invalid; give at least one depth, each between 0 and 1."),
        ({"chain_len": 0}, "chain_len is 0; it must be at least 1."),
        ({"value_digits": 0}, "value_digits is 0; it must be between 1 and 9."),
        ({"value_digits": 1, "n_keys": 12}, "value_digits 1 gives only 10 distinct values, fewer than n_keys/n_chains; use more digits."),
        ({"n_keys": 99}, "n_keys 99 exceeds the 24 distinct key words; use at most 24."),
        ({"questions_per_haystack": 4, "n_chains": 3}, "questions_per_haystack 4 exceeds n_keys or n_chains; each question needs its own key and chain."),
    ],
)
def test_spec_validation_is_one_clear_sentence(kwargs, message):
    with pytest.raises(ValidationError) as err:
        lc.LongCtxSpec(**kwargs)
    (first,) = err.value.errors()
    assert first["msg"].removeprefix("Value error, ") == message


def test_spec_is_strict_and_frozen():
    with pytest.raises(ValidationError, match="extra"):
        lc.LongCtxSpec(lenghts=(2048,))
    with pytest.raises(ValidationError):
        lc.LongCtxSpec().seed = 3  # type: ignore[misc]


def test_unknown_probe():
    with pytest.raises(UserError, match=r"^unknown probe `needle`; known: passkey, multikey, vartrack\.$"):
        lc.generate("needle", None)


# ----------------------------------------------------------------------------- lm-eval


@pytest.fixture(scope="module")
def longctx_tasks():
    """lm-eval's own index of just tasks/longctx (the full index takes ~20 s to build)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS), include_defaults=False)


@pytest.mark.parametrize("probe", lc.PROBES)
def test_lm_eval_contexts_equal_the_prompts(longctx_tasks, builtin_tok, tmp_path, probe):
    from lm_eval.tasks._yaml_loader import load_yaml

    spec = lc.LongCtxSpec(lengths=(512,), sparse_block=512, tp_sizes=(4,), items_per_length=3)
    path = lc.write_probe(probe, builtin_tok, spec, tmp_path)
    name = f"longctx_{probe}"
    cfg = load_yaml(longctx_tasks.task_index[name].yaml_path, resolve_func=True)
    # the placeholder in the YAML is what resolve_data_file recognises
    placeholder = cfg["dataset_kwargs"]["data_files"]["test"]
    assert placeholder == lc.DATA_FILE_PLACEHOLDER.replace("{probe}", probe)
    assert lc.resolve_data_file(placeholder, builtin_tok, spec, tmp_path) == path
    assert lc.resolve_data_file("gsm8k_synth/test.jsonl", builtin_tok, spec, tmp_path) is None
    # what evalpipe.tasks.configure.task_config does with a data_files override
    cfg.pop("tag", None)
    cfg["dataset_kwargs"] = {"data_files": {"test": str(path)}, "cache_dir": str(tmp_path / "hf")}
    task = longctx_tasks.load([cfg])["tasks"][name]  # as lm_eval.simple_evaluate loads it
    task.build_all_requests(rank=0, world_size=1, system_instruction=None, apply_chat_template=False)
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(task.instances) == len(docs) == 12
    for inst in task.instances:
        context, gen_kwargs = inst.args
        doc = docs[inst.doc_id]
        assert context == doc["prompt"] and _n(builtin_tok, context) == doc["target_length"]
        assert gen_kwargs["until"] == ["\n"] and gen_kwargs["do_sample"] is False
    # scoring: the continuation " <answer>" (stopped before "\n") is an exact match
    doc = task.test_docs()[0]
    assert task.doc_to_target(doc) == docs[0]["answer"]
    assert task.process_results(doc, [lc.TARGET_DELIMITER + docs[0]["answer"]])["exact_match"] == 1.0
    assert task.process_results(doc, [docs[0]["answer"] + " "])["exact_match"] == 1.0
    assert task.process_results(doc, [" " + docs[0]["answer"][:-1]])["exact_match"] == 0.0


# ----------------------------------------------------------------------------- training texts


def test_training_pairs(bpe_tok):
    pairs = lc.training_pairs("vartrack", bpe_tok, 5, [512, 600], seed=lc.TRAIN_SEED, test_spec=SMALL)
    assert len(pairs) == 5
    for prompt, answer in pairs:
        assert prompt.endswith("The variables are")
        assert re.fullmatch(r"[A-Z]{5}(, [A-Z]{5})*", answer)
    assert [_n(bpe_tok, p) for p, _ in pairs] == [512, 600, 512, 600, 512]  # interleaved across lengths
    test_prompts = {it["prompt"] for it in lc.generate("vartrack", bpe_tok, SMALL)}
    assert not any(p in test_prompts for p, _ in pairs)
    with pytest.raises(ValueError, match="equals the test seed"):
        lc.training_pairs("passkey", bpe_tok, 2, [512], seed=SMALL.seed, test_spec=SMALL)
