"""Artifacts that cannot be shown to belong to their job join the diagnosis only as "unverified". Pure.

The run check (`jobs.profiling.run_check`) compares what a file says about its capture (GPU model, time,
rank, host) with the job. A py-spy profile carries none of these, nor does a dstat log of a job without a
host mapping: the check is `unverifiable`. Such a file may be the job's own profile, or a profile of an
unrelated CPU program uploaded by mistake (issue 24: a BPE tokenizer's py-spy profile raised a job's
data_pipeline_stall confidence from 70 % to 85 %). So, until a user confirms it:

* the findings, their confidence, severity and dollars are those of the diagnosis *without* the
  unverified artifacts;
* what the unverified artifacts add is kept visible: evidence they add to a finding is appended with an
  "unverified" label, and a finding that exists only because of them is listed at the lowest confidence
  (`thresholds.MIN_CONFIDENCE`), info severity, unknown dollars, its title starting "Unverified:".

What it cannot do: tell the job's own py-spy profile from another program's; the user decides (confirm).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput, Evidence, Finding, Severity
from jobs.diagnosis.engine import diagnose

UNVERIFIED = "unverified"


def diagnose_checked(
    inp: DiagnosisInput, unverified: Sequence[ArtifactAnalysis], *, codes: tuple[str, ...] | None = None
) -> list[Finding]:
    """`engine.diagnose` where the artifacts in `unverified` (a subset of `inp.artifacts`, compared by
    identity) cannot raise any finding's confidence, severity or dollars (see the module docstring)."""
    ids = {id(a) for a in unverified}
    if not any(id(a) in ids for a in inp.artifacts):
        return diagnose(inp, codes=codes)
    kept = [a for a in inp.artifacts if id(a) not in ids]
    findings = diagnose(dataclasses.replace(inp, artifacts=kept), codes=codes)
    with_them = diagnose(inp, codes=codes)
    names = ", ".join(sorted({a.name or a.kind for a in inp.artifacts if id(a) in ids}))[:200]
    by_code = {f.code: f for f in findings}
    for f in with_them:
        known = by_code.get(f.code)
        if known is None:
            findings.append(as_unverified(f, names))
        else:
            add_unverified_evidence(known, f, names)
    return findings


def as_unverified(f: Finding, names: str) -> Finding:
    """A finding that exists only because of unverified artifacts: shown, but trusted least."""
    return dataclasses.replace(
        f,
        severity=Severity.INFO,
        confidence=T.MIN_CONFIDENCE,
        title=f"Unverified: {f.title}",
        evidence=[_note(names), *f.evidence],
        sources=[*f.sources, f"{UNVERIFIED}: {names}"],
        waste_per_day_usd=None,
        waste_share=None,
    )


def add_unverified_evidence(known: Finding, f: Finding, names: str) -> None:
    """Append to `known` the evidence `f` has beyond it (what the unverified artifacts add), labelled."""
    have = {(e.label, e.value) for e in known.evidence}
    extra = [e for e in f.evidence if (e.label, e.value) not in have]
    if not extra:
        return
    known.evidence.append(_note(names))
    known.evidence.extend(Evidence(f"{UNVERIFIED}: {e.label}", e.value, e.unit) for e in extra)
    known.sources.append(f"{UNVERIFIED}: {names}")


def _note(names: str) -> Evidence:
    return Evidence(
        UNVERIFIED,
        f"from {names}, which carries no GPU, time, rank or host that shows it belongs to this job: it does "
        "not raise this finding's confidence until a user confirms it",
    )
