"""Deterministic synthetic GSM8K-format word problems.

Each item looks like a GSM8K record::

    {"question": "Mia has 14 stickers. She buys 9 more stickers. How many stickers does Mia have now?",
     "answer": "Mia has 14 + 9 = <<14+9=23>>23 stickers now.\\n#### 23",
     "n_steps": 1}

The answer holds one worked line per arithmetic step, each with a GSM8K calculator
annotation ``<<a op b=c>>``, and ends with ``#### N``. Problems take one to three steps
(+, -, *, and / with exact results) and every intermediate and final result is a
non-negative integer.

Everything is driven by ``random.Random(seed)``, so the same seed gives the same items
and :func:`write_splits` gives byte-identical files. The ``test`` split is generated
first; ``train`` (the few-shot pool) and :func:`training_corpus` (what the built-in
model is trained on, see :mod:`evalpipe.models.builtin`) exclude every test question.

The number ranges (:class:`Ranges`: results stay <= 100) are tuned together with the
built-in ``tiny-gsm`` model: small enough that a model trained for a few CPU minutes
learns the arithmetic, large enough that it cannot answer by copying numbers from the
question. Changing them (or any template) changes the data: bump ``GENERATOR_VERSION``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from evalpipe.atomic_files import write_text
from evalpipe.paths import data_dir

# Bump whenever generated text changes: it is part of the built-in model's spec hash.
GENERATOR_VERSION = 1

DATASET_NAME = "gsm8k_synth"

# split name -> (number of items, seed)
SPLITS: dict[str, tuple[int, int]] = {
    "test": (600, 1_000_003),
    "train": (1000, 2_000_003),
}
# Seed of the built-in model's training stream (distinct from both splits).
CORPUS_SEED = 3_000_017

# lm-eval's gsm8k "strict-match" filter and answer format.
STRICT_MATCH_REGEX = r"#### (\-?[0-9\.\,]+)"
ANSWER_PREFIX = "#### "


# ----------------------------------------------------------------------------- vocabulary

_NAMES = [
    ("Tom", "m"), ("Mia", "f"), ("Liam", "m"), ("Emma", "f"), ("Noah", "m"), ("Ava", "f"),
    ("Jack", "m"), ("Lily", "f"), ("Ben", "m"), ("Zoe", "f"), ("Sam", "m"), ("Anna", "f"),
    ("Leo", "m"), ("Ella", "f"), ("Max", "m"), ("Ruth", "f"), ("Omar", "m"), ("Nina", "f"),
    ("Carl", "m"), ("Rosa", "f"), ("Ivan", "m"), ("Kate", "f"), ("Paul", "m"), ("Sara", "f"),
    ("John", "m"), ("Lucy", "f"), ("Mark", "m"), ("Jane", "f"), ("Alex", "m"), ("Maya", "f"),
]

_OBJECTS = [
    "apples", "marbles", "stickers", "cookies", "pencils", "books", "cards", "shells",
    "stamps", "coins", "eggs", "balloons", "candies", "flowers", "toys", "crayons",
    "oranges", "beads", "rocks", "cupcakes",
]

_ITEMS = [  # (singular, plural)
    ("notebook", "notebooks"), ("pen", "pens"), ("ticket", "tickets"), ("shirt", "shirts"),
    ("toy car", "toy cars"), ("cake", "cakes"), ("book", "books"), ("plant", "plants"),
    ("mug", "mugs"), ("hat", "hats"), ("ball", "balls"), ("lamp", "lamps"),
]

_CONTAINERS = [  # (plural, what is inside)
    ("boxes", "crayons"), ("bags", "apples"), ("baskets", "eggs"), ("jars", "cookies"),
    ("packs", "cards"), ("trays", "cupcakes"), ("crates", "oranges"), ("bowls", "candies"),
    ("rows", "chairs"), ("shelves", "books"),
]

_RATES = [  # (verb phrase, unit)
    ("reads", "pages"), ("walks", "miles"), ("bakes", "cookies"), ("saves", "dollars"),
    ("writes", "letters"), ("plants", "trees"), ("paints", "pictures"), ("folds", "shirts"),
    ("picks", "apples"), ("drinks", "glasses of water"),
]

_PLACES = ["at the store", "at the market", "at the fair", "at the shop"]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
_GROUP_PEOPLE = ["friends", "kids", "students", "cousins", "neighbors", "teams"]


@dataclass(frozen=True)
class Ranges:
    """Number ranges (inclusive). Tuned with the built-in model; see module docstring."""

    start: tuple[int, int] = (5, 30)  # a starting quantity
    delta: tuple[int, int] = (2, 15)  # an amount added or removed
    factor: tuple[int, int] = (2, 6)  # the small side of a product
    count: tuple[int, int] = (2, 10)  # the other side of a product (a price, a rate)
    divisor: tuple[int, int] = (2, 4)
    max_value: int = 100  # every intermediate and final result stays <= this


RANGES = Ranges()


# ----------------------------------------------------------------------------- building blocks


class _Reject(Exception):
    """The random draw produced an out-of-range value; draw again."""


def _calc(a: int, op: str, b: int, r: Ranges) -> int:
    if op == "+":
        c = a + b
    elif op == "-":
        c = a - b
    elif op == "*":
        c = a * b
    elif op == "/":
        if b == 0 or a % b:
            raise _Reject
        c = a // b
    else:  # pragma: no cover - programming error
        raise ValueError(op)
    if c < 0 or c > r.max_value:
        raise _Reject
    return c


def _step(a: int, op: str, b: int, r: Ranges) -> tuple[str, int]:
    """GSM8K-style calculation with annotation: ``12 + 7 = <<12+7=19>>19``."""
    c = _calc(a, op, b, r)
    return f"{a} {op} {b} = <<{a}{op}{b}={c}>>{c}", c


class _Person:
    def __init__(self, rng: random.Random, avoid: Iterable[str] = ()):
        avoid = set(avoid)
        self.name, g = rng.choice([n for n in _NAMES if n[0] not in avoid])
        self.he = "he" if g == "m" else "she"
        self.He = self.he.capitalize()
        self.his = "his" if g == "m" else "her"


def _ri(rng: random.Random, lo_hi: tuple[int, int]) -> int:
    return rng.randint(lo_hi[0], lo_hi[1])


# ----------------------------------------------------------------------------- scenarios
# Each scenario returns (question, [answer lines without the final "#### N"], result).


def _inventory(rng: random.Random, r: Ranges, n_steps: int):
    p = _Person(rng)
    obj = rng.choice(_OBJECTS)
    x = _ri(rng, r.start)
    q = [rng.choice([f"{p.name} has {x} {obj}.", f"{p.name} had {x} {obj}.",
                     f"{p.name} collected {x} {obj}."])]
    lines = []
    final_q = f"How many {obj} does {p.name} have now?"
    for i in range(n_steps):
        last = i == n_steps - 1
        kind = rng.choice(["add", "sub", "mul", "div"] if last and i > 0 else ["add", "sub", "mul"])
        if kind == "add":
            b = _ri(rng, r.delta)
            q.append(rng.choice([
                f"{p.He} buys {b} more {obj}.",
                f"{p.He} finds {b} more {obj}.",
                f"{p.He} gets {b} more {obj} from a friend.",
                f"Then {p.he} wins {b} {obj}.",
            ]))
            calc, x = _step(x, "+", b, r)
            lines.append(f"{p.name} then has {calc} {obj}.")
        elif kind == "sub":
            b = _ri(rng, r.delta)
            other = _Person(rng, avoid=[p.name]).name
            q.append(rng.choice([
                f"{p.He} gives {b} {obj} to {other}.",
                f"{p.He} loses {b} {obj}.",
                f"{p.He} sells {b} {obj}.",
                f"Then {p.he} uses {b} {obj}.",
            ]))
            calc, x = _step(x, "-", b, r)
            lines.append(f"{p.name} then has {calc} {obj}.")
        elif kind == "mul":
            k = rng.choice([2, 3])
            word = {2: "doubles", 3: "triples"}[k]
            q.append(f"Then the number of {obj} {p.he} has {word}.")
            calc, x = _step(x, "*", k, r)
            lines.append(f"{p.name} then has {calc} {obj}.")
        else:  # div: only as the last step; changes the question
            k = _ri(rng, r.divisor)
            box = rng.choice(["bags", "boxes", "piles", "jars"])
            q.append(f"{p.He} puts them equally into {k} {box}.")
            calc, x = _step(x, "/", k, r)
            lines.append(f"Each of the {box} has {calc} {obj}.")
            final_q = f"How many {obj} are in each of the {box}?"
    q.append(final_q)
    return " ".join(q), lines, x


def _shopping(rng: random.Random, r: Ranges, n_steps: int):
    p = _Person(rng)
    (item, items), (item2, _) = rng.sample(_ITEMS, 2)
    n = _ri(rng, r.factor)
    price = _ri(rng, r.count)
    place = rng.choice(_PLACES)
    q = [f"{p.name} buys {n} {items} {place} for ${price} each."]
    calc, total = _step(n, "*", price, r)
    lines = [f"The {items} cost {calc} dollars."]
    final_q = f"How much money does {p.name} spend?"
    if n_steps >= 2:
        extra = _ri(rng, r.delta)
        if n_steps == 3 or rng.random() < 0.5:
            q.append(f"{p.He} also buys a {item2} for ${extra}.")
            calc, total = _step(total, "+", extra, r)
            lines.append(f"{p.He} spends {calc} dollars in total.")
            final_q = f"How much money does {p.name} spend in total?"
        if n_steps == 3 or len(lines) == 1:
            bill = rng.choice([b for b in (20, 50, 100, 200) if b >= total] or [0])
            if bill == 0:
                raise _Reject
            q.append(f"{p.He} pays with a ${bill} bill.")
            calc, total = _step(bill, "-", total, r)
            lines.append(f"{p.He} gets {calc} dollars in change.")
            final_q = f"How much change does {p.name} get?"
    q.append(final_q)
    return " ".join(q), lines, total


def _compare(rng: random.Random, r: Ranges, n_steps: int):
    p1 = _Person(rng)
    p2 = _Person(rng, avoid=[p1.name])
    obj = rng.choice(_OBJECTS)
    a = _ri(rng, r.start)
    q = [f"{p1.name} has {a} {obj}."]
    kind = rng.choice(["more", "fewer", "times"])
    if kind == "more":
        b = _ri(rng, r.delta)
        q.append(f"{p2.name} has {b} more {obj} than {p1.name}.")
        calc, c = _step(a, "+", b, r)
    elif kind == "fewer":
        b = _ri(rng, r.delta)
        q.append(f"{p2.name} has {b} fewer {obj} than {p1.name}.")
        calc, c = _step(a, "-", b, r)
    else:
        k = rng.choice([2, 3, 4])
        q.append(f"{p2.name} has {k} times as many {obj} as {p1.name}.")
        calc, c = _step(a, "*", k, r)
    lines = [f"{p2.name} has {calc} {obj}."]
    if n_steps == 1:
        q.append(f"How many {obj} does {p2.name} have?")
        return " ".join(q), lines, c
    calc, t = _step(a, "+", c, r)
    lines.append(f"Together they have {calc} {obj}.")
    if n_steps == 2:
        q.append(f"How many {obj} do {p1.name} and {p2.name} have together?")
        return " ".join(q), lines, t
    k = _ri(rng, r.divisor)
    q.append(f"They share all their {obj} equally among {k} {rng.choice(_GROUP_PEOPLE)}.")
    q.append(f"How many {obj} does each one get?")
    calc, e = _step(t, "/", k, r)
    lines.append(f"Each one gets {calc} {obj}.")
    return " ".join(q), lines, e


def _rate(rng: random.Random, r: Ranges, n_steps: int):
    p = _Person(rng)
    verb, unit = rng.choice(_RATES)
    base = verb[:-1]  # "reads" -> "read"
    rate = _ri(rng, r.count)
    days = _ri(rng, r.factor)
    q = [f"{p.name} {verb} {rate} {unit} every day for {days} days."]
    calc, x = _step(rate, "*", days, r)
    lines = [f"In {days} days {p.he} {verb} {calc} {unit}."]
    final_q = f"How many {unit} does {p.name} {base} in {days} days?"
    if n_steps >= 2:
        b = _ri(rng, r.delta)
        q.append(f"On the last day {p.he} {verb} {b} extra {unit}.")
        calc, x = _step(x, "+", b, r)
        lines.append(f"With the extra {unit} that is {calc} {unit}.")
        final_q = f"How many {unit} does {p.name} {base} in total?"
    if n_steps >= 3:
        other = _Person(rng, avoid=[p.name])
        c = _ri(rng, r.delta)
        q.append(f"{other.name} {verb} {c} fewer {unit} than {p.name} over those days.")
        calc, x = _step(x, "-", c, r)
        lines.append(f"{other.name} {verb} {calc} {unit}.")
        final_q = f"How many {unit} does {other.name} {base} in total?"
    q.append(final_q)
    return " ".join(q), lines, x


def _grouping(rng: random.Random, r: Ranges, n_steps: int):
    container, obj = rng.choice(_CONTAINERS)
    g = _ri(rng, r.factor)
    k = _ri(rng, r.count)
    q = [f"There are {g} {container} with {k} {obj} in each."]
    calc, t = _step(g, "*", k, r)
    lines = [f"There are {calc} {obj}."]
    final_q = f"How many {obj} are there in all?"
    if n_steps >= 2:
        x = _ri(rng, r.delta)
        q.append(rng.choice([f"{x} of the {obj} are taken away.", f"{x} of the {obj} are broken.",
                             f"{x} of the {obj} are given away."]))
        calc, t = _step(t, "-", x, r)
        lines.append(f"There are {calc} {obj} left.")
        final_q = f"How many {obj} are left?"
    if n_steps >= 3:
        m = _ri(rng, r.divisor)
        who = rng.choice(_GROUP_PEOPLE)
        q.append(f"The rest are shared equally among {m} {who}.")
        calc, t = _step(t, "/", m, r)
        lines.append(f"Each of the {who} gets {calc} {obj}.")
        final_q = f"How many {obj} does each of the {who} get?"
    q.append(final_q)
    return " ".join(q), lines, t


def _half(rng: random.Random, r: Ranges, n_steps: int):
    p = _Person(rng)
    obj = rng.choice(_OBJECTS)
    m1, m2 = rng.sample(range(12), 2)
    a = 2 * rng.randint((r.start[0] + 1) // 2, r.start[1] // 2)
    q = [f"{p.name} sold {a} {obj} in {_MONTHS[m1]}, and then {p.he} sold half as many {obj} in {_MONTHS[m2]}."]
    calc, h = _step(a, "/", 2, r)
    lines = [f"{p.name} sold {calc} {obj} in {_MONTHS[m2]}."]
    if n_steps == 1:
        q.append(f"How many {obj} did {p.name} sell in {_MONTHS[m2]}?")
        return " ".join(q), lines, h
    calc, t = _step(a, "+", h, r)
    lines.append(f"{p.name} sold {calc} {obj} in all.")
    q.append(f"How many {obj} did {p.name} sell in {_MONTHS[m1]} and {_MONTHS[m2]}?")
    return " ".join(q), lines, t


_Scenario = Callable[[random.Random, Ranges, int], tuple[str, list[str], int]]
# (scenario, allowed step counts)
_SCENARIOS: list[tuple[_Scenario, tuple[int, ...]]] = [
    (_inventory, (1, 2, 3)),
    (_shopping, (1, 2, 3)),
    (_compare, (1, 2, 3)),
    (_rate, (1, 2, 3)),
    (_grouping, (1, 2, 3)),
    (_half, (1, 2)),
]
# Probability of 1, 2, 3 steps.
STEP_WEIGHTS = (0.4, 0.35, 0.25)


def _one(rng: random.Random, r: Ranges) -> dict:
    while True:
        scenario, allowed = rng.choice(_SCENARIOS)
        n_steps = rng.choices((1, 2, 3), weights=STEP_WEIGHTS)[0]
        if n_steps not in allowed:
            continue
        try:
            question, lines, result = scenario(rng, r, n_steps)
        except _Reject:
            continue
        answer = "\n".join(lines + [f"{ANSWER_PREFIX}{result}"])
        return {"question": question, "answer": answer, "n_steps": n_steps}


# ----------------------------------------------------------------------------- public API


def iter_problems(seed: int, exclude: Iterable[str] = (), *, unique: bool = True,
                  ranges: Ranges | None = None) -> Iterator[dict]:
    """Endless deterministic stream of problems whose question is not in ``exclude``."""
    ranges = ranges or RANGES
    rng = random.Random(seed)
    excluded = set(exclude)
    seen: set[str] = set()
    while True:
        item = _one(rng, ranges)
        q = item["question"]
        if q in excluded or q in seen:
            continue
        if unique:
            seen.add(q)
        yield item


def generate(n: int, seed: int, exclude: Iterable[str] = (), *, ranges: Ranges | None = None) -> list[dict]:
    """``n`` distinct problems for ``seed``, none of whose questions is in ``exclude``."""
    out: list[dict] = []
    for item in iter_problems(seed, exclude, ranges=ranges):
        if len(out) >= n:
            break
        out.append(item)
    return out


def make_splits() -> dict[str, list[dict]]:
    """The ``test`` split first, then ``train`` excluding every test question."""
    n_test, seed_test = SPLITS["test"]
    test = generate(n_test, seed_test)
    n_train, seed_train = SPLITS["train"]
    train = generate(n_train, seed_train, exclude={d["question"] for d in test})
    return {"test": test, "train": train}


def held_out_questions() -> set[str]:
    """Questions the built-in model must never be trained on (the test split)."""
    n_test, seed_test = SPLITS["test"]
    return {d["question"] for d in generate(n_test, seed_test)}


def training_corpus(seed: int = CORPUS_SEED, exclude: Iterable[str] | None = None) -> Iterator[dict]:
    """Endless stream for training the built-in model; never yields a test question.

    Repeats are allowed (the stream is long), test questions never are.
    """
    if exclude is None:
        exclude = held_out_questions()
    return iter_problems(seed, exclude, unique=False)


def to_jsonl(items: Iterable[dict]) -> str:
    return "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in items)


def write_splits(out_dir: Path) -> dict[str, Path]:
    """Make ``train.jsonl`` and ``test.jsonl`` in ``out_dir`` hold exactly what this
    generator produces, rewriting (atomically) only files whose bytes differ."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, items in make_splits().items():
        path = out_dir / f"{name}.jsonl"
        text = to_jsonl(items)
        if not path.is_file() or path.read_bytes() != text.encode("utf-8"):
            write_text(path, text)
        paths[name] = path
    return {k: paths[k] for k in SPLITS}


def default_dir() -> Path:
    return data_dir() / DATASET_NAME


def ensure_splits(out_dir: Path | None = None) -> dict[str, Path]:
    """The split files under ``data_dir()/gsm8k_synth`` (or ``out_dir``).

    Generating takes ~0.1 s, so the files are checked against a fresh generation on
    every call: files left by an older generator, or edited by hand, never silently
    stand in for the data set this code defines."""
    return write_splits(Path(out_dir) if out_dir is not None else default_dir())


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def format_example(item: dict) -> str:
    """One example exactly as lm-eval's gsm8k prompt shows a few-shot example."""
    return f"Question: {item['question']}\nAnswer: {item['answer']}"
