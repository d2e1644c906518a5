"""The `bisect:` section: where `evalpipe bisect` takes its candidate builds from (the
commits of a git repository, or an ordered list of builds) and how hard it looks at each
(docs/bisect.md)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictInt, field_validator, model_validator

from evalpipe.config.strict import Strict
from evalpipe.paths import PLAIN_NAME_RULE, is_plain_name


class BuildSpec(Strict):
    """One build of an explicit list: what it changes in the searched variant."""

    name: str = Field(description="The build's name: what --good and --bad give, and its runs' directory names.")
    description: str = ""
    env: dict[str, str] = Field(default_factory=dict, description="Environment over the variant's (a wheel's directory on PYTHONPATH, a switch).")
    python: str | None = Field(default=None, description="Interpreter of the build's environment (default: the variant's).")
    launch: dict[str, Any] = Field(default_factory=dict, description="Overrides of the variant's `launch:` (e.g. a launcher that runs a container image).")

    @field_validator("name")
    @classmethod
    def _plain(cls, value: str) -> str:
        if not is_plain_name(value):
            raise ValueError(f"build name {value!r} is not a plain name (it names run directories); use {PLAIN_NAME_RULE}")
        return value


class Escalation(Strict):
    """One rerun of a step that came out UNKNOWN: more items, more samples per item (a config
    that samples), or both; what it leaves out stays as the level before it had it."""

    limit: StrictInt | None = Field(default=None, ge=1, description="Items per task of the rerun (larger than the level before).")
    samples: StrictInt | None = Field(default=None, ge=2, le=1024, description="Samples per item of the rerun, for a config with `sampling:` (more than the level before).")

    @model_validator(mode="after")
    def _something(self) -> Escalation:
        if self.limit is None and self.samples is None:
            raise ValueError("an escalation gives `limit:`, `samples:` or both")
        return self


class BisectSpec(Strict):
    repo: str | None = Field(default=None, min_length=1, description="Git repository the searched variant takes its code from (a plugin or engine source); `~` expands, relative to the config's directory.")
    builds: list[BuildSpec] | None = Field(default=None, description="Instead of `repo:`, the candidate builds in order, oldest first (wheels, interpreters, images through a launcher, settings).")
    variant: str | None = Field(default=None, description="The variant whose build is searched: its env, engine args and interpreter, with each candidate's tree on its PYTHONPATH (default: the reference).")
    pythonpath: list[str] = Field(default_factory=lambda: ["."], min_length=1, description="Directories of a candidate's tree put first on the variant's PYTHONPATH, relative to the tree's root.")
    build: list[str] | None = Field(default=None, min_length=1, description="A command run once in each candidate's tree before its run (e.g. compiling an extension in place); a build that fails is skipped with its reason, on the good end it stops the bisect before anything runs.")
    first_parent: bool = Field(default=True, description="Candidates are the first-parent commits between the ends (a merged branch is one candidate), as vllm-ascend's tools/bisect does.")
    escalate: list[Escalation] = Field(default_factory=list, description="The reruns of a step that came out UNKNOWN, in order: each an item limit (an integer, larger than the run's own), or `{limit: N, samples: M}` (more samples per item, for a config with `sampling:`); past the last one the build is skipped.")
    confirm: bool = Field(default=True, description="Run a DIFFERENT build a second time; a build whose two runs differ from each other beyond the good build's A/A floor is UNKNOWN (it does not repeat itself), never blamed.")
    localize: bool = Field(default=True, description="Run `evalpipe localize` on the first DIFFERENT build against the good build's reference.")

    @field_validator("escalate", mode="before")
    @classmethod
    def _limits(cls, value: Any) -> Any:
        """An integer is an item limit; a mapping says more (checked by Escalation)."""
        if not isinstance(value, list):
            return value
        for entry in value:
            if isinstance(entry, bool) or (isinstance(entry, int) and entry < 1):
                raise ValueError(f"got {value}; give item limits that are positive and grow (a valid integer each, "
                                 "e.g. [100, 300]), or mappings with `limit:` and `samples:`")
        return [{"limit": entry} if isinstance(entry, int) else entry for entry in value]

    @field_validator("escalate")
    @classmethod
    def _growing(cls, value: list[Escalation]) -> list[Escalation]:
        for field in ("limit", "samples"):
            given = [getattr(e, field) for e in value if getattr(e, field) is not None]
            if any(b <= a for a, b in zip(given, given[1:])):
                raise ValueError(f"the escalations' {field} values {given} must grow: each rerun looks harder than the one before")
        return value

    @field_validator("pythonpath")
    @classmethod
    def _inside(cls, value: list[str]) -> list[str]:
        bad = next((p for p in value if p.startswith("/") or ".." in p.split("/")), None)
        if bad is not None:
            raise ValueError(f"{bad!r} leaves the candidate's tree; give directories relative to its root, e.g. `.` or `src`")
        return value

    @field_validator("builds")
    @classmethod
    def _distinct(cls, value: list[BuildSpec] | None) -> list[BuildSpec] | None:
        if value is None:
            return value
        if len(value) < 2:
            raise ValueError("give at least two builds (a good one and a later, bad one)")
        names = [b.name for b in value]
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ValueError(f"build `{twice}` is named twice; give every build a name of its own")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> BisectSpec:
        if (self.repo is None) == (self.builds is None):
            raise ValueError("give the candidates either as `repo:` (a git repository) or as `builds:` (an ordered list), one of the two")
        if self.builds is not None and (self.build is not None or "pythonpath" in self.model_fields_set or "first_parent" in self.model_fields_set):
            raise ValueError("`build:`, `pythonpath:` and `first_parent:` apply to the commits of a `repo:`; "
                             "a `builds:` list says what each build changes itself")
        return self

    def build_named(self, name: str) -> BuildSpec:
        return next(b for b in self.builds or [] if b.name == name)
