"""The `bisect:` section: where `evalpipe bisect` takes its candidate builds from and how
hard it looks at each (docs/bisect.md)."""

from __future__ import annotations

from pydantic import Field, StrictInt, field_validator

from evalpipe.config.strict import Strict


class BisectSpec(Strict):
    repo: str = Field(min_length=1, description="Git repository the searched variant takes its code from (a plugin or engine source); `~` expands, relative to the config's directory.")
    variant: str | None = Field(default=None, description="The variant whose build is searched: its env, engine args and interpreter, with each candidate's tree on its PYTHONPATH (default: the reference).")
    pythonpath: list[str] = Field(default_factory=lambda: ["."], min_length=1, description="Directories of a candidate's tree put first on the variant's PYTHONPATH, relative to the tree's root.")
    build: list[str] | None = Field(default=None, min_length=1, description="A command run once in each candidate's tree before its run (e.g. compiling an extension in place); a build that fails is skipped with its reason, on the good end it stops the bisect before anything runs.")
    first_parent: bool = Field(default=True, description="Candidates are the first-parent commits between the ends (a merged branch is one candidate), as vllm-ascend's tools/bisect does.")
    escalate: list[StrictInt] = Field(default_factory=list, description="Item limits of the reruns of a step that came out UNKNOWN, in order (each larger than the run's own); past the last one the build is skipped.")
    confirm: bool = Field(default=True, description="Run a DIFFERENT build a second time; a build whose two runs differ from each other beyond the good build's A/A floor is UNKNOWN (it does not repeat itself), never blamed.")
    localize: bool = Field(default=True, description="Run `evalpipe localize` on the first DIFFERENT build against the good build's reference.")

    @field_validator("escalate")
    @classmethod
    def _growing(cls, value: list[int]) -> list[int]:
        if any(n < 1 for n in value) or any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError(f"got {value}; give item limits that are positive and grow, e.g. [100, 300]")
        return value

    @field_validator("pythonpath")
    @classmethod
    def _inside(cls, value: list[str]) -> list[str]:
        bad = next((p for p in value if p.startswith("/") or ".." in p.split("/")), None)
        if bad is not None:
            raise ValueError(f"{bad!r} leaves the candidate's tree; give directories relative to its root, e.g. `.` or `src`")
        return value
