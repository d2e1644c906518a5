"""The nightly dashboard's data: every night of a config, each score series with its A/A
band, each token series, and the latest night's flagged changes. Built from the history by
evalpipe.nightly.dashboard_data, rendered by evalpipe.report.dashboard.

Every text in it is untrusted (task names, component versions, prompts): the renderer
escapes it; the types here only say what each field is.
"""

from __future__ import annotations

from evalpipe.documents.base import Document
from evalpipe.documents.comparison import Status
from evalpipe.documents.nightly_doc import NightStatus, SeriesChange


class NightEntry(Document):
    """One night on the timeline."""

    run_id: str
    night: str  # its date and time (UTC, ISO 8601)
    status: NightStatus = NightStatus.PASS
    verdict: Status | None = None  # tonight's own comparison
    report: str | None = None  # its report.html, relative to the dashboard
    baseline: str | None = None
    reasons: list[str] = []


class ScoreValue(Document):
    """A variant's mean of one task x metric on one night, with its 95 % interval."""

    run_id: str
    night: str
    value: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    n: int | None = None


class Band(Document):
    """The A/A band: how far two runs of the same engine on the same night lie apart."""

    low: float
    high: float


class ScoreSeries(Document):
    task: str
    metric: str
    variant: str
    points: list[ScoreValue] = []
    aa_band: Band | None = None
    changes: list[int] = []  # indexes into points where a flagged change starts


class TokenValue(Document):
    """A token measure of one night's comparison, beside the same night's A/A value."""

    run_id: str
    night: str
    value: float | None
    aa_value: float | None = None


class TokenSeries(Document):
    task: str
    variant: str
    measure: str  # free_kl_p99, ...
    log: bool = False  # drawn on a log scale
    points: list[TokenValue] = []
    changes: list[int] = []


class DashboardData(Document):
    title: str
    generated_at: str
    database: str  # where the history is (without its password)
    nights: list[NightEntry] = []
    series: list[ScoreSeries] = []
    token_series: list[TokenSeries] = []
    changes: list[SeriesChange] = []  # the latest night's flagged changes, newest first
