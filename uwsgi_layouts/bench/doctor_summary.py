"""What a doctor run concluded, as data: the ``DoctorSummary`` its report renders.

``bench.diagnosis`` judges a window's figures (``findings``, ``tune_command``,
``growth_quotable``); ``summarize`` asks it once per diagnosis, at the end of the run, and keeps
the answers: the findings (each with what to do), the ``uwsgi-layouts tune`` command to try ("":
no request was served, nothing to size for) and the workers whose memory growth per hour is
quoted. It is stored as ``summary.json`` beside results.json (kind ``doctor``, ``VERSION``;
``bench.stored``), and ``uwsgi-layouts report`` renders from it, so a stored run says what it said
even after the thresholds change. The window's figures stay in results.json: the summary holds
decisions, not data. A run stored without one is judged again from its figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from uwsgi_layouts.bench.diagnosis import Finding, findings, growth_quotable, tune_command
from uwsgi_layouts.bench.results import Diagnosis, Results
from uwsgi_layouts.bench.stored import StoredSummary

KIND = "doctor"
VERSION = 1


@dataclass(frozen=True)
class Judgement:
    """One diagnosis as judged: its findings, most important first; the tune command to try;
    the workers (ids) whose memory growth per hour says something."""

    findings: tuple[Finding, ...]
    tune: str
    growth_quoted: tuple[str, ...]


@dataclass(frozen=True)
class DoctorSummary(StoredSummary):
    """Everything a doctor run concluded, one ``Judgement`` per diagnosis in results.json's order.
    ``created`` and the number of diagnoses tie it to its results.json."""

    KIND = KIND
    VERSION = VERSION

    version: int
    kind: str
    created: str
    diagnoses: tuple[Judgement, ...]

    def __post_init__(self):
        self.check_header()

    def matches(self, results: Results) -> bool:
        """Whether this summary was made from ``results``."""
        return (self.created, len(self.diagnoses)) == (results.created, len(results.diagnoses))


def judge(d: Diagnosis) -> Judgement:
    quoted = tuple(w for w, m in d.memory.get("workers", {}).items() if growth_quotable(m))
    return Judgement(tuple(findings(d)), tune_command(d) if d.requests else "", quoted)


def summarize(results: Results) -> DoctorSummary:
    """What a doctor run concluded, judged once, here."""
    return DoctorSummary(VERSION, KIND, results.created, tuple(judge(d) for d in results.diagnoses))
