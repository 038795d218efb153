"""Run every rule on one job, relate symptoms to causes, and apportion the job's waste in dollars per day.

Dollars (documented method; the invariant is that the findings' dollars never add up to more than the
job's waste/day):

* Each rule estimates its finding's `impact`: the share of the job's GPU time the cause costs (e.g. the
  share of time in idle gaps, 1 - clock/boost on throttled GPUs, idle GPU-time / all GPU-time).
* The job's measured loss is L = waste/day / cost/day = max(0, 1 - MFU / reference MFU).
* Causes first: finding k gets cost/day x impact_k x min(1, L / sum of the causes' impacts). Causes that
  together explain no more than the measured loss keep their own estimate; when their estimates overlap
  or overshoot, they are scaled down in proportion, so their sum is at most waste/day.
* Symptoms (false_saturation, baseline_regression) describe the same loss from another angle: they share
  only what the causes leave unexplained, in proportion to their impacts, each capped at its own estimate.
* `unexplained_waste` gets exactly what is left after every other finding got its dollars, and is kept
  only when that is at least the material threshold (`account_unexplained`); with MFU unknown, what is left
  of the idle-waste lower bound.
* Without a waste figure the dollars are unknown, not $0: every finding gets None ("impact unknown"),
  except `idle_gpus`, whose dollars need no MFU (idle GPU-hours × price: the job's idle waste, passed in).
  A job that meets its reference (waste 0) gives every finding a known $0.

`waste_share` is the finding's dollars / the job's waste/day.
"""

from __future__ import annotations

import logging

from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import (
    REMAINDER_CODE,
    SYMPTOM_CODES,
    DiagnosisInput,
    Evidence,
    Finding,
    Severity,
    rank_key,
)
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules import RULES, shared_gpu

log = logging.getLogger(__name__)

#: Causes that explain a symptom. GPU errors and idle GPUs do not explain low SM activity on busy GPUs.
EXPLAINS: dict[str, frozenset[str]] = {
    "false_saturation": frozenset(RULES) - SYMPTOM_CODES - {"gpu_errors", "idle_gpus"},
    "baseline_regression": frozenset(RULES) - SYMPTOM_CODES,
}
UNEXPLAINED = REMAINDER_CODE


def diagnose(inp: DiagnosisInput, *, codes: tuple[str, ...] | None = None) -> list[Finding]:
    """All findings for one job, symptoms related to causes, dollars apportioned, most expensive first.

    A rule that raises is logged and skipped: one broken rule must not hide the others' findings.
    """
    features = Features(inp)
    findings: list[Finding] = []
    for code, rule in RULES.items():
        if codes is not None and code not in codes:
            continue
        try:
            finding = rule(inp, features)
        except Exception:
            log.exception("diagnosis rule %s failed", code)
            continue
        if finding is not None:
            findings.append(finding)
    gate_short_jobs(findings, features)
    shared_gpu.qualify(findings, inp)
    relate_symptoms(findings)
    catch_all = [f for f in findings if f.code == UNEXPLAINED]
    findings = [f for f in findings if f.code != UNEXPLAINED]
    apportion(findings, inp.cost_per_day_usd, inp.waste_per_day_usd, inp.idle_waste_per_day_usd)
    if catch_all:
        kept = account_unexplained(catch_all[0], findings, inp)
        if kept is not None:
            findings.append(kept)
    findings.sort(key=lambda f: rank_key(f.code, f.waste_per_day_usd, f.severity, f.confidence))
    for f in findings:
        f.title = sentence_case(f.title)
    return findings


def sentence_case(title: str) -> str:
    """A finding's title as a sentence: its first letter upper-case ("MFU 51 % worse", not "mfu 51 % worse");
    the rest is left as the rule wrote it (names such as "NVLink" or "XID" keep their case)."""
    return title[:1].upper() + title[1:]


#: Codes that may warn on few samples: an XID is a fact in one sample; unexplained money is money.
NO_SAMPLE_MINIMUM = frozenset({"gpu_errors", UNEXPLAINED})


def gate_short_jobs(findings: list[Finding], features: Features) -> None:
    """Metrics-only findings on fewer than MIN_SAMPLES_TO_WARN samples per GPU are context (info): a
    14-minute pod at 60 s has 15 samples, too few to tell a cause from chance. Artifact evidence is
    exempt (a trace measures the cause directly)."""
    if features.sigs is None or features.samples_per_gpu >= T.MIN_SAMPLES_TO_WARN:
        return
    for f in findings:
        if f.code in NO_SAMPLE_MINIMUM or any(s != "metrics" for s in f.sources):
            continue
        if f.severity.rank > Severity.INFO.rank:
            f.severity = Severity.INFO
            f.evidence.append(
                Evidence("samples per GPU (too few to warn)", features.samples_per_gpu, "count")
            )


def account_unexplained(candidate: Finding, others: list[Finding], inp: DiagnosisInput) -> Finding | None:
    """Give `unexplained_waste` the waste the other findings leave, or drop it when that is not material."""
    known = inp.waste_per_day_usd is not None
    waste = inp.waste_per_day_usd if known else inp.idle_waste_per_day_usd
    cost = inp.cost_per_day_usd
    if waste is None or not cost or cost <= 0:
        return None
    spent = sum(f.waste_per_day_usd or 0.0 for f in others)
    left = max(waste - spent, 0.0)
    if left < inp.material_waste_usd_per_day:
        return None
    candidate.waste_per_day_usd = left
    candidate.waste_share = left / waste if waste > 0 else None
    candidate.impact = min(left / cost, 1.0)
    if candidate.impact >= T.UNEXPLAINED_WARN_SHARE:
        candidate.severity = Severity.WARNING
    found = sorted(f.code for f in others if f.severity.rank >= Severity.WARNING.rank)
    candidate.title = (
        f"${left:,.0f}/day of {'waste' if known else 'idle waste (lower bound)'} that no finding explains"
        + (f" (beyond {', '.join(found)})" if found else "")
    )
    candidate.evidence.insert(0, Evidence("unexplained waste/day", round(left, 2), "USD/day"))
    return candidate


def relate_symptoms(findings: list[Finding]) -> None:
    """Keep a symptom as info-level context when a warning-or-worse cause that explains it was found."""
    causes = [f for f in findings if f.code not in SYMPTOM_CODES and f.severity.rank >= Severity.WARNING.rank]
    for f in findings:
        if f.code not in SYMPTOM_CODES:
            continue
        explained = sorted(c.code for c in causes if c.code in EXPLAINS.get(f.code, frozenset()))
        if not explained:
            continue
        f.severity = Severity.INFO
        f.title = f"{f.title} — explained by {', '.join(explained)}"
        f.evidence.append(Evidence("explained by", ", ".join(explained)))


def usd_or_unknown(value: float | None) -> float:
    """Sort key: unknown dollars rank below every known amount, including $0."""
    return -1.0 if value is None else value


def apportion(
    findings: list[Finding],
    cost_per_day: float | None,
    waste_per_day: float | None,
    idle_waste_per_day: float | None = None,
) -> None:
    """Set `waste_per_day_usd` and `waste_share` on each finding (see the module docstring)."""
    if not findings:
        return
    if not cost_per_day or cost_per_day <= 0 or waste_per_day is None:
        for f in findings:
            known_idle = f.code == "idle_gpus" and idle_waste_per_day is not None and cost_per_day
            f.waste_per_day_usd = idle_waste_per_day if known_idle else None
            f.waste_share = None
        return
    if waste_per_day <= 0:
        for f in findings:
            f.waste_per_day_usd, f.waste_share = 0.0, 0.0
        return
    loss = min(waste_per_day / cost_per_day, 1.0)
    causes = [f for f in findings if f.code not in SYMPTOM_CODES]
    symptoms = [f for f in findings if f.code in SYMPTOM_CODES]
    total = sum(max(f.impact, 0.0) for f in causes)
    scale = min(1.0, loss / total) if total > 0 else 0.0
    for f in causes:
        f.waste_per_day_usd = cost_per_day * max(f.impact, 0.0) * scale
    left = max(waste_per_day - sum(f.waste_per_day_usd or 0.0 for f in causes), 0.0)
    wanted = sum(cost_per_day * max(f.impact, 0.0) for f in symptoms)
    share = min(1.0, left / wanted) if wanted > 0 else 0.0
    for f in symptoms:
        f.waste_per_day_usd = cost_per_day * max(f.impact, 0.0) * share
    # Float rounding must not break the invariant.
    spent = sum(f.waste_per_day_usd or 0.0 for f in findings)
    for f in findings:
        usd = f.waste_per_day_usd or 0.0
        f.waste_per_day_usd = usd * waste_per_day / spent if spent > waste_per_day else usd
        f.waste_share = f.waste_per_day_usd / waste_per_day
