"""Evaluation of the diagnosis on simulated jobs: random job specs, scoring, confusion tables. Pure.

`make_jobs` draws N jobs per scenario (random seeds, noise levels, GPU counts, durations, scenario knobs
and, when samples go missing, missing-signal variants such as dcgm-exporter's default counters without
SM_ACTIVE). A pseudo-scenario `baseline_regression` is a healthy job compared with a faster baseline. The
`evaluate_diagnosis` command runs them through a real Prometheus and the whole pipeline; `run_direct`
runs the same jobs through `diagnosis_inputs.signals_from_sim` (no Prometheus) for quick experiments.

Scoring: a job's predicted codes are its findings at warning or critical severity (info findings are
context, not diagnoses). Per code: precision = TP / (TP + FP), recall = TP / (TP + FN) over the jobs whose
planted code is that code; healthy jobs count as false warnings when any code is predicted.

Not production code (it imports the simulator): it lives under benchmarks/, beside the inputs it scores
(benchmarks.diagnosis_inputs), and the `evaluate_diagnosis` command imports it from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.diagnosis import regimes as R
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.base import Finding
from jobs.metrics.signals import DEFAULT_DISABLED
from jobs.simulate import SCENARIOS, SimResult, SimSpec, simulate
from jobs.simulate.exporter import (
    Exporter,
    Workload,
    collective_at_sm,
    collective_wait,
    healthy,
    input_stall,
    tiny_kernels,
)

BASELINE_SCENARIO = "baseline_regression"
VARIANTS: dict[str, frozenset[str]] = {
    "complete": frozenset(),
    "no_sm_active": frozenset({"sm_active"}),
    "default_exporter": DEFAULT_DISABLED,
}
GPU_COUNTS = (4, 8, 12, 16)
DURATIONS_S = (3600.0, 5400.0, 7200.0)
HEALTHY = "healthy"


@dataclass(frozen=True, slots=True)
class EvalJob:
    """One simulated job of the evaluation and what was planted in it."""

    job_id: str
    scenario: str
    truth: str  # the planted finding code, "" for healthy
    spec: SimSpec
    variant: str
    baseline: dict[str, dict[str, float]] | None = None
    regime: str = ""  # "resolved" / "unresolved" for the matrix's step-level jobs


@dataclass(slots=True)
class Outcome:
    """What the diagnosis said about one job."""

    job: EvalJob
    predicted: set[str]
    info: set[str] = field(default_factory=set)
    waste_per_day_usd: float | None = None
    findings_usd: float = 0.0


def scenario_names() -> list[str]:
    """Simulator scenarios plus the baseline pseudo-scenario."""
    return [*SCENARIOS, BASELINE_SCENARIO]


def truth_code(scenario: str) -> str:
    """The finding code a scenario plants ("" for healthy)."""
    return BASELINE_SCENARIO if scenario == BASELINE_SCENARIO else SCENARIOS[scenario].code


def make_jobs(
    per_scenario: int,
    *,
    seed: int = 0,
    missing_fraction: float = 0.0,
    noise: float = 0.05,
    gpu_model: str = "NVIDIA H100 80GB HBM3",
    scenarios: Sequence[str] | None = None,
    id_prefix: str = "eval",
) -> list[EvalJob]:
    """Random simulated jobs, `per_scenario` of each scenario, each on its own hosts.

    Noise levels are drawn uniformly from [0.2, 1] x `noise`. With `missing_fraction` > 0, every job loses
    that share of scrapes and draws a missing-signal variant (complete / no SM_ACTIVE / default exporter
    counters); with 0 the signals are complete.
    """
    rng = np.random.default_rng(seed)
    jobs: list[EvalJob] = []
    for scenario in scenarios or scenario_names():
        for _ in range(per_scenario):
            n = len(jobs)
            gpus = int(rng.choice(GPU_COUNTS))
            variant = str(rng.choice(list(VARIANTS))) if missing_fraction > 0 else "complete"
            sim_scenario = HEALTHY if scenario == BASELINE_SCENARIO else scenario
            hosts = tuple(f"{id_prefix}{n:04d}-node{h}" for h in range(-(-gpus // 8)))
            spec = SimSpec(
                scenario=sim_scenario,
                gpus=gpus,
                gpu_model=gpu_model,
                hosts=hosts,
                job_id=f"{id_prefix}-{n:04d}",
                duration_s=float(rng.choice(DURATIONS_S)),
                step_s=30.0,
                seed=int(rng.integers(0, 2**31 - 1)),
                noise=float(noise * rng.uniform(0.2, 1.0)),
                missing_fraction=missing_fraction,
                disabled=VARIANTS[variant],
                params=_params(sim_scenario, rng),
            )
            baseline = None
            if scenario == BASELINE_SCENARIO:
                # A healthy run of this config used to reach 25-40 % more MFU.
                median = 0.45 * float(rng.uniform(1.25, 1.4))
                baseline = {"mfu": {"median": median, "mad": 0.01, "iqr": 0.013, "n": 5}}
            jobs.append(EvalJob(spec.job_id or "", scenario, truth_code(scenario), spec, variant, baseline))
    return jobs


def _params(scenario: str, rng: np.random.Generator) -> dict[str, Any]:
    if scenario == "data_pipeline_stall":
        return {"stall_every": int(rng.choice([3, 4, 5, 6]))}
    if scenario == "communication_wait":
        return {"period_samples": int(rng.choice([6, 8, 10, 12]))}
    if scenario == "idle_gpus":
        return {"idle_from": float(rng.choice([0.1, 0.3, 0.5]))}
    if scenario == "gpu_errors":
        return {"xid": int(rng.choice([94, 79, 48, 13]))}
    return {}


def outcome(job: EvalJob, findings: Iterable[Finding | dict[str, Any]], waste: float | None) -> Outcome:
    """Split a job's findings (dataclasses or dicts with code/severity/waste) into predictions and info."""
    out = Outcome(job, set(), waste_per_day_usd=waste)
    for f in findings:
        code = f["code"] if isinstance(f, dict) else f.code
        sev = f["severity"] if isinstance(f, dict) else f.severity.value
        usd = f["waste_per_day_usd"] if isinstance(f, dict) else f.waste_per_day_usd
        out.findings_usd += float(usd or 0.0)
        (out.predicted if sev in T.DIAGNOSIS_SEVERITIES else out.info).add(code)
    return out


@dataclass(slots=True)
class Report:
    """Scores of one evaluation run."""

    per_code: dict[str, dict[str, float]]
    confusion: dict[str, Counter[str]]
    jobs_per_scenario: Counter[str]
    healthy_false_warning_rate: float | None
    dollars_ok: bool
    outcomes: list[Outcome]

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form."""
        per_code = {
            code: {k: (None if isinstance(v, float) and v != v else v) for k, v in m.items()}
            for code, m in self.per_code.items()
        }
        return {
            "per_code": per_code,
            "confusion": {k: dict(v) for k, v in self.confusion.items()},
            "jobs_per_scenario": dict(self.jobs_per_scenario),
            "healthy_false_warning_rate": self.healthy_false_warning_rate,
            "findings_dollars_within_waste": self.dollars_ok,
        }


def score(outcomes: Sequence[Outcome]) -> Report:
    """Precision, recall and the confusion table (planted scenario x predicted code)."""
    codes = sorted({o.job.truth for o in outcomes if o.job.truth})
    per_code: dict[str, dict[str, float]] = {}
    for code in codes:
        tp = sum(1 for o in outcomes if o.job.truth == code and code in o.predicted)
        fn = sum(1 for o in outcomes if o.job.truth == code and code not in o.predicted)
        fp = sum(1 for o in outcomes if o.job.truth != code and code in o.predicted)
        per_code[code] = {
            "tp": tp,
            "fp": fp,
            "fn": fn,
            "precision": tp / (tp + fp) if tp + fp else float("nan"),
            "recall": tp / (tp + fn) if tp + fn else float("nan"),
        }
    confusion: dict[str, Counter[str]] = {}
    for o in outcomes:
        row = confusion.setdefault(o.job.scenario, Counter())
        row.update(o.predicted or {"(none)"})
    healthy = [o for o in outcomes if not o.job.truth]
    rate = sum(1 for o in healthy if o.predicted) / len(healthy) if healthy else None
    # A job with unknown waste has only idle_gpus dollars (its idle waste, the stated lower bound).
    dollars_ok = all(
        o.findings_usd <= o.waste_per_day_usd * (1 + 1e-9) + 1e-6
        for o in outcomes
        if o.waste_per_day_usd is not None
    )
    return Report(
        per_code, confusion, Counter(o.job.scenario for o in outcomes), rate, dollars_ok, list(outcomes)
    )


def format_report(report: Report, *, title: str = "") -> str:
    """The confusion table and the per-code precision/recall table as fixed-width text."""
    lines = [title] if title else []
    scenarios = list(report.confusion)
    cols = sorted({c for row in report.confusion.values() for c in row}, key=lambda c: (c == "(none)", c))
    short = {c: _abbrev(c) for c in cols}
    lines.append("Confusion: planted scenario (rows) x codes diagnosed at warning+ (columns), job counts")
    lines.append("  ".join(f"{short[c]:>5}" for c in cols).rjust(22 + 7 * len(cols)))
    for s in scenarios:
        row = report.confusion[s]
        cells = "  ".join(f"{row.get(c, 0) or '.':>5}" for c in cols)
        lines.append(f"{s[:20]:<20} {report.jobs_per_scenario[s]:>3}  {cells}")
    lines.append("  " + "; ".join(f"{short[c]}={c}" for c in cols))
    lines.append("")
    lines.append(f"{'code':<22}{'TP':>5}{'FP':>5}{'FN':>5}{'precision':>11}{'recall':>9}")
    for code, m in report.per_code.items():
        lines.append(
            f"{code:<22}{m['tp']:>5}{m['fp']:>5}{m['fn']:>5}{_fmt(m['precision']):>11}{_fmt(m['recall']):>9}"
        )
    rate = report.healthy_false_warning_rate
    lines.append("")
    lines.append(
        f"healthy jobs with a warning-or-worse finding: {_fmt(rate)}"
        f" (no warning in {_fmt(None if rate is None else 1 - rate)})"
    )
    lines.append(f"findings' $/day never exceed the job's waste/day: {report.dollars_ok}")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.2f}"


ABBREVIATIONS = {
    "false_saturation": "FSAT",
    "data_pipeline_stall": "DATA",
    "launch_overhead": "LNCH",
    "communication_wait": "COMM",
    "throttling": "THRT",
    "tensor_cores_idle": "TCOR",
    "memory_bound": "MEMB",
    "host_device_copy": "HDCP",
    "host_sync": "SYNC",
    "straggler": "STRG",
    "idle_gpus": "IDLE",
    "memory_headroom": "HDRM",
    "baseline_regression": "BASE",
    "gpu_errors": "XID",
    "(none)": "none",
}


def _abbrev(code: str) -> str:
    return ABBREVIATIONS.get(code, code[:5])


def run_direct(
    jobs: Sequence[EvalJob], diagnose_job: Callable[[EvalJob, SimResult], tuple[list[Finding], float | None]]
) -> list[Outcome]:
    """Simulate each job and diagnose it with `diagnose_job` (e.g. via diagnosis_inputs.input_from_sim)."""
    outcomes = []
    for job in jobs:
        res = simulate(job.spec)
        findings, waste = diagnose_job(job, res)
        outcomes.append(outcome(job, findings, waste))
    return outcomes


# --------------------------------------------------------------------------------- variant matrix

MATRIX_SCRAPES_S = (5.0, 15.0, 30.0, 60.0)
#: Step times: 0.2-10 s (far below to around the sampling) and 120 s (resolved at every scrape up to 30 s).
MATRIX_STEPS_S = (0.2, 2.0, 10.0, 120.0)
#: NVML's utilisation window, the two ends of "between 1 second and 1/6 second, depending on the product"
#: (NVML API reference, nvmlUtilization_t): every job is recorded at each.
MATRIX_NVML_WINDOWS_S = (1.0 / 6.0, 1.0)
#: Mean SM activity of the comm-bound variants (NCCL spinning, heavy NVLink): no SM ceiling may hide them.
MATRIX_COMM_SM = (0.2, 0.35, 0.5, 0.65, 0.8)


def matrix_workloads(step_s: float, comm_sm: Sequence[float] = MATRIX_COMM_SM) -> list[tuple[str, Workload]]:
    """The variants at one step time: healthy, input stall synchronised / staggered across nodes (30 % of
    the step) and the seed's 2/3 wait, collective wait with NCCL spinning / a host-side drop x link traffic
    in the troughs / idle links, collectives spinning at each mean SM activity of `comm_sm`, and tiny
    kernels (launch-bound, the step time does not matter)."""
    out: list[tuple[str, Workload]] = [("healthy", healthy(step_s))]
    for sync in ("synchronised", "staggered"):
        out.append((f"input stall, {sync}", input_stall(step_s, 0.3, sync=sync)))
    out.append(("input stall 2/3 of the step", input_stall(step_s, 2.0 / 3.0)))
    for mode in ("spin", "drop"):
        for links in ("troughs", "idle"):
            out.append(
                (f"collective {mode}, links {links}", collective_wait(step_s, 0.3, mode=mode, links=links))
            )
    for sm in comm_sm:
        out.append((f"collective spin at SM {sm:.0%}", collective_at_sm(step_s, sm)))
    out.append(("tiny kernels", tiny_kernels(min(step_s, 2.0))))
    return out


def matrix_jobs(
    *,
    seed: int = 0,
    scrapes: Sequence[float] = MATRIX_SCRAPES_S,
    steps: Sequence[float] = MATRIX_STEPS_S,
    windows: Sequence[float] = MATRIX_NVML_WINDOWS_S,
    comm_sm: Sequence[float] = MATRIX_COMM_SM,
    duration_s: float = 3600.0,
    gpus: int = 16,
    id_prefix: str = "matrix",
) -> list[EvalJob]:
    """One job per (scrape interval, step time, NVML window, variant): 16 GPUs on 2 nodes, noise drawn per
    job, ~1 % failed scrapes, every third job with a node lost for 10 minutes and every other job with
    dcgm-exporter's default counters (no SM_ACTIVE, no NVLink TX/RX). The regime is the planted step's:
    resolved when the step spans at least regimes.RESOLVED_MIN_SAMPLES scrapes."""
    rng = np.random.default_rng(seed)
    jobs: list[EvalJob] = []
    for scrape in scrapes:
        for step in steps:
            for window, (name, workload) in (
                (w, v) for w in windows for v in matrix_workloads(step, comm_sm)
            ):
                n = len(jobs)
                default_counters = n % 2 == 1
                exporter = Exporter(
                    scrape_s=scrape,
                    collect_s=30.0,
                    nvml_window_s=float(window),
                    failed_scrapes=0.01,
                    node_lost=(float(rng.uniform(0.2, 0.8)), 600.0) if n % 3 == 0 else None,
                    noise=float(rng.uniform(0.005, 0.03)),
                )
                spec = SimSpec(
                    scenario="healthy",
                    gpus=gpus,
                    hosts=tuple(f"{id_prefix}{n:04d}-node{h}" for h in range(-(-gpus // 8))),
                    job_id=f"{id_prefix}-{n:04d}",
                    duration_s=duration_s,
                    seed=int(rng.integers(0, 2**31 - 1)),
                    noise=0.02,
                    disabled=DEFAULT_DISABLED if default_counters else frozenset(),
                    workload=workload,
                    exporter=exporter,
                )
                regime = "resolved" if step >= R.RESOLVED_MIN_SAMPLES * scrape else "unresolved"
                variant = f"{name}; step {step:g} s; scrape {scrape:g} s; NVML window {_window(window)}" + (
                    "; default counters" if default_counters else ""
                )
                jobs.append(EvalJob(spec.job_id or "", name, workload.code, spec, variant, regime=regime))
    return jobs


def _window(seconds: float) -> str:
    return "1/6 s" if abs(seconds - 1.0 / 6.0) < 1e-9 else f"{seconds:g} s"


def format_matrix(outcomes: Sequence[Outcome], *, title: str = "") -> str:
    """Precision and recall per code, overall and per regime (resolved / unresolved), plus per scrape."""
    lines = [title] if title else []
    groups: list[tuple[str, list[Outcome]]] = [("all", list(outcomes))]
    for regime in ("resolved", "unresolved"):
        groups.append((regime, [o for o in outcomes if o.job.regime == regime]))
    windows = sorted({o.job.spec.exporter.nvml_window_s for o in outcomes if o.job.spec.exporter is not None})
    if len(windows) > 1:
        for w in windows:
            groups.append(
                (
                    f"NVML window {_window(w)}",
                    [
                        o
                        for o in outcomes
                        if o.job.spec.exporter is not None and o.job.spec.exporter.nvml_window_s == w
                    ],
                )
            )
    codes = sorted({o.job.truth for o in outcomes if o.job.truth})
    header = f"{'code':<22}" + "".join(f"{g:>24}" for g, _ in groups)
    lines.append(
        "Precision / recall (TP FP FN) per code at warning+, by regime of the planted step and NVML window"
    )
    lines.append(header)
    reports = [(g, score(os_)) for g, os_ in groups if os_]
    for code in codes:
        cells = []
        for _, rep in reports:
            m = rep.per_code.get(code)
            cells.append(
                "-".rjust(24)
                if m is None
                else f"{_fmt(m['precision'])}/{_fmt(m['recall'])} ({m['tp']} {m['fp']} {m['fn']})".rjust(24)
            )
        lines.append(f"{code:<22}" + "".join(cells))
    for g, rep in reports:
        rate = rep.healthy_false_warning_rate
        jobs = sum(rep.jobs_per_scenario.values())
        lines.append(
            f"{g}: {jobs} jobs; healthy with a warning: {_fmt(rate)}; dollars within waste: {rep.dollars_ok}"
        )
    lines.append("")
    lines.append("Missed or wrong (planted variant -> codes at warning+):")
    for o in outcomes:
        wrong = (o.job.truth and o.job.truth not in o.predicted) or (
            o.predicted - {o.job.truth, "unexplained_waste"}
        )
        if wrong:
            lines.append(f"  [{o.job.regime}] {o.job.variant}: {', '.join(sorted(o.predicted)) or '(none)'}")
    return "\n".join(lines)
