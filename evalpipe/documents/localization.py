"""localize.json: where in the model each localized variant first parts from the
reference, beside compare.json in the run directory. Written by `evalpipe localize` (from
:class:`evalpipe.compare.localize.Localization`), read by the reports; localizing a
variant again replaces its entry and keeps the others'."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

from evalpipe.atomic_files import write_json
from evalpipe.documents.base import Document, read_json_object, validated
from evalpipe.errors import UserError

LOCALIZE_JSON = "localize.json"
LOCALIZE_VERSION: Final = 1


class PositionDoc(Document):
    label: str  # the sequence: "<task> doc <id>"
    position: int  # absolute token position in the sequence (prompt + continuation)
    rel_l2: float | None  # None: NaN or inf on one side only
    flags: list[str] = []  # "a shard boundary of T = 4", "the last token before the padding of T = 4", ...


class ModuleDoc(Document):
    layer: int
    module: str  # attn.in, attn.heads, attn.partials, attn.out, attn.residual, mlp.out, layer.out
    title: str  # what it is, in words
    rows: int = 0  # positions compared
    rel_l2: float | None = None  # reference vs variant: the largest relative L2 error over positions
    cosine: float | None = None  # the smallest cosine similarity
    max_abs: float | None = None  # the largest absolute error
    aa_rel_l2: float | None = None  # reference vs its A/A run, same module and positions
    aa_cosine: float | None = None
    aa_max_abs: float | None = None
    floor: float  # the bound rel_l2 is held to: max(numerics floor, rel_aa x aa_rel_l2)
    above: bool = False
    worst: list[PositionDoc] = []
    not_reassembled: str | None = None  # why the full tensor could not be put together, on which side
    nonfinite: int = 0  # positions with NaN or inf on one side only (then above, whatever rel_l2 says)


class LayerPoint(Document):
    """The residual stream after one layer: reference vs variant next to reference vs A/A."""

    layer: int
    rel_l2: float | None = None
    aa_rel_l2: float | None = None


class SequenceDoc(Document):
    label: str
    tokens: int
    rows: list[int]  # the positions captured
    why: dict[str, list[str]] = {}  # position -> why it was chosen ("worst teacher-forced", "shard boundary T=4", ...)


class LocalizeDocument(Document):
    """One variant's localization."""

    run_id: str
    variant: str
    reference: str
    aa: str | None = None  # the configuration run as the A/A floor (None: none)
    modes: dict[str, Literal["offline", "serve"]]  # per configuration: how its engine ran
    dtype: str | None = None
    precision: str
    numerics_floor: float  # the floor by precision (docs/numerics.md)
    rel_aa: float
    aa_identical: bool | None = None  # None: no A/A configuration
    sequences: list[SequenceDoc]
    modules: list[ModuleDoc]  # forward order: layer by layer, module by module
    first: ModuleDoc | None = None  # the first module above its floor; None: none is
    sentence: str  # the answer in one sentence
    layer_curve: list[LayerPoint] = []
    not_reassembled: list[str] = []  # "<module> of layer N: <why>"
    seconds: dict[str, float] = {}  # per configuration, the engine's wall time; "analysis"
    capture_bytes: dict[str, int] = {}  # per configuration, the bytes the engine wrote


class LocalizeFile(Document):
    version: Literal[1] = LOCALIZE_VERSION
    localizations: list[LocalizeDocument]


def write_localizations(run_dir: Path, docs: list[LocalizeDocument]) -> tuple[Path, Path | None]:
    """localize.json with ``docs``, replacing earlier entries of the same variants; and where
    an existing file this evalpipe cannot read was put aside (``localize.json.unreadable``:
    never lost, never in the way of the finished localization), else None."""
    path = run_dir / LOCALIZE_JSON
    aside = None
    try:
        earlier = read_localizations(run_dir)
    except UserError:
        aside = path.with_name(LOCALIZE_JSON + ".unreadable")
        os.replace(path, aside)
        earlier = []
    kept = [d for d in earlier if d.variant not in {n.variant for n in docs}]
    write_json(path, LocalizeFile(localizations=[*kept, *docs]).model_dump(mode="json"))
    return path, aside


def read_localizations(run_dir: Path) -> list[LocalizeDocument]:
    """The localizations of a run directory (none: an empty list)."""
    path = run_dir / LOCALIZE_JSON
    if not path.is_file():
        return []
    raw = read_json_object(path, "run `evalpipe localize` again")
    if raw.get("version") != LOCALIZE_VERSION:
        raise UserError(f"{path} is a localization of version {raw.get('version')!r}; this evalpipe reads version "
                        f"{LOCALIZE_VERSION}: run `evalpipe localize` again.")
    return validated(LocalizeFile, raw, str(path), "run `evalpipe localize` again").localizations
