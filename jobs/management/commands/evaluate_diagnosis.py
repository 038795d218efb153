"""`manage.py evaluate_diagnosis`: score the diagnosis on simulated jobs run through the whole pipeline.

N jobs per scenario (random seeds, noise levels, GPU counts, durations and, with --missing-fraction > 0,
missing-signal variants such as dcgm-exporter's default counters without SM_ACTIVE) are simulated,
backfilled with promtool into a private Prometheus started for the run, registered as jobs (throughput from
the simulator's train_tokens_total through a throughput_query), finalized
(jobs.pipeline.poll.finalize_job) and
diagnosed (jobs.pipeline.findings.run_diagnosis). Prints the confusion table, precision and recall per code
and the
healthy jobs' false-warning rate. Everything it writes to the database is rolled back at the end.

`--matrix` is the benchmark of variants the rules were not tuned on (benchmarks/diagnosis_harness.py,
matrix_jobs):
scrape interval 5/15/30/60 s x step 0.2/2/10/120 s x NVML window 1/6 s and 1 s x healthy, input stall
synchronised/staggered and 2/3 of the step, collective spin/drop x link traffic in the troughs/idle links,
collectives spinning at mean SM activity 20/35/50/65/80 %, tiny kernels; recorded through NVML's
window, DCGM's collect interval, per-target scrape offsets, ~1 % failed scrapes, a lost node, noise and
dcgm-exporter's default counters on every other job. It reads them back as ingestion would
(benchmarks.diagnosis_inputs.signals_from_sim: lookback, rate windows, per-GPU rows) without Prometheus or the
database, and prints precision and recall per code, overall, per regime (resolved / unresolved) and per
NVML window. A benchmark to print, not a timed test.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from argparse import ArgumentParser
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from benchmarks.diagnosis_harness import (
    BASELINE_SCENARIO,
    EvalJob,
    Outcome,
    format_matrix,
    format_report,
    make_jobs,
    matrix_jobs,
    outcome,
    run_direct,
    scenario_names,
    score,
)
from benchmarks.diagnosis_inputs import input_from_sim
from jobs.diagnosis import Finding, diagnose
from jobs.intake.registry import register_job
from jobs.metrics.prometheus import PrometheusClient
from jobs.metrics.promserver import PrometheusProcess, PrometheusStartError, prometheus_binary
from jobs.models import Baseline, Job, Team
from jobs.pipeline.findings import run_diagnosis
from jobs.pipeline.poll import finalize_job
from jobs.simulate import SimResult, backfill, registration_body, simulate, write_openmetrics
from jobs.simulate.core import EXTRA_KEYS


class _Rollback(Exception):
    """Raised inside the evaluation's transaction to undo everything it wrote."""


class Command(BaseCommand):
    help = "Evaluate the diagnosis rules on simulated jobs through a real Prometheus (writes nothing)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--per-scenario", type=int, default=6, help="jobs per scenario (default 6)")
        parser.add_argument("--seed", type=int, default=0, help="seed of the random job specs")
        parser.add_argument(
            "--missing-fraction",
            type=float,
            default=0.0,
            help="share of scrapes lost per host; > 0 also draws missing-signal variants (default 0)",
        )
        parser.add_argument(
            "--noise", type=float, default=0.05, help="largest noise level; each job draws 0.2-1 x this"
        )
        parser.add_argument("--scenarios", default="", help="comma-separated subset of scenarios")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--matrix",
            action="store_true",
            help="score the variant matrix (scrape x step x variant, both regimes) directly, no Prometheus",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["matrix"]:
            self._matrix(opts)
            return
        if prometheus_binary() is None:
            raise CommandError("prometheus is not installed (Debian package 'prometheus', or PROMETHEUS_BIN)")
        if opts["per_scenario"] < 1 or not 0.0 <= opts["missing_fraction"] < 1.0 or opts["noise"] < 0:
            raise CommandError("need --per-scenario >= 1, 0 <= --missing-fraction < 1 and --noise >= 0")
        wanted = [s for s in opts["scenarios"].split(",") if s] or None
        unknown = set(wanted or ()) - set(scenario_names())
        if unknown:
            raise CommandError(f"unknown scenarios {sorted(unknown)}; known: {', '.join(scenario_names())}")
        started = time.monotonic()
        jobs = make_jobs(
            opts["per_scenario"],
            seed=opts["seed"],
            missing_fraction=opts["missing_fraction"],
            noise=opts["noise"],
            scenarios=wanted,
            id_prefix=f"evaldiag{secrets.token_hex(3)}",
        )
        sims = [simulate(j.spec) for j in jobs]
        for sim in sims:
            for key in EXTRA_KEYS:  # fields no rule reads: smaller backfill
                sim.fields.pop(key, None)
        self._progress(f"simulated {len(jobs)} jobs in {time.monotonic() - started:.0f} s")
        with tempfile.TemporaryDirectory(prefix="evaluate-diagnosis-") as work:
            om = Path(work) / "jobs.om"
            write_openmetrics(sims, om)
            backfill(om, Path(work) / "tsdb")
            om.unlink()
            self._progress(f"backfilled into Prometheus blocks after {time.monotonic() - started:.0f} s")
            try:
                with PrometheusProcess(Path(work) / "tsdb", ready_timeout_s=60) as prom:
                    client = PrometheusClient(prom.url, timeout_s=60, retries=1)
                    outcomes = self._run(jobs, sims, client)
            except PrometheusStartError as exc:
                raise CommandError(str(exc)) from exc
        report = score(outcomes)
        elapsed = time.monotonic() - started
        if opts["json"]:
            data = report.as_dict() | {
                "settings": {k: opts[k] for k in ("per_scenario", "seed", "missing_fraction", "noise")},
                "jobs": len(jobs),
                "elapsed_s": round(elapsed, 1),
            }
            self.stdout.write(json.dumps(data, indent=2, default=_json_default))
            return
        title = (
            f"evaluate_diagnosis: {len(jobs)} jobs ({opts['per_scenario']} per scenario), "
            f"seed {opts['seed']}, missing samples {opts['missing_fraction']:.0%}, "
            f"noise up to {opts['noise']}, {elapsed:.0f} s"
        )
        self.stdout.write(format_report(report, title=title))
        variants = sorted({j.variant for j in jobs})
        self.stdout.write(f"signal variants: {', '.join(variants)}")

    def _matrix(self, opts: dict[str, Any]) -> None:
        started = time.monotonic()
        jobs = matrix_jobs(seed=opts["seed"])

        def diagnose_job(ej: EvalJob, sim: SimResult) -> tuple[list[Finding], float | None]:
            inp = input_from_sim(sim)
            return diagnose(inp), inp.waste_per_day_usd

        outcomes: list[Outcome] = []
        for i, job in enumerate(jobs):
            outcomes += run_direct([job], diagnose_job)
            if (i + 1) % 32 == 0:
                self._progress(f"diagnosed {i + 1}/{len(jobs)} matrix jobs")
        elapsed = time.monotonic() - started
        if opts["json"]:
            data = {
                regime: score([o for o in outcomes if regime == "all" or o.job.regime == regime]).as_dict()
                for regime in ("all", "resolved", "unresolved")
            }
            self.stdout.write(json.dumps(data | {"jobs": len(jobs), "elapsed_s": round(elapsed, 1)}, indent=2,
                                         default=_json_default))  # fmt: skip
            return
        title = f"evaluate_diagnosis --matrix: {len(jobs)} jobs, seed {opts['seed']}, {elapsed:.0f} s"
        self.stdout.write(format_matrix(outcomes, title=title))

    def _run(self, jobs: list[EvalJob], sims: list[SimResult], client: PrometheusClient) -> list[Outcome]:
        outcomes: list[Outcome] = []
        try:
            with transaction.atomic():
                team = Team.objects.create(
                    slug=f"evaluate-diagnosis-{secrets.token_hex(4)}", name="evaluate_diagnosis (rolled back)"
                )
                for i, (ej, sim) in enumerate(zip(jobs, sims, strict=True)):
                    job = self._register(ej, sim, team)
                    end = job.ended_at or job.started_at
                    job = finalize_job(job, client, now=end + timedelta(hours=1))
                    if job.ingest_error:
                        raise CommandError(f"finalize failed for {job.external_id}: {job.ingest_error}")
                    stored = run_diagnosis(job)
                    found = [
                        {"code": f.code, "severity": f.severity, "waste_per_day_usd": f.waste_per_day_usd}
                        for f in stored
                    ]
                    outcomes.append(outcome(ej, found, job.waste_per_day_usd))
                    if (i + 1) % 20 == 0:
                        self._progress(f"diagnosed {i + 1}/{len(jobs)} jobs")
                raise _Rollback
        except _Rollback:
            pass
        return outcomes

    def _register(self, ej: EvalJob, sim: SimResult, team: Team) -> Job:
        # A model name per job keeps every job's config fingerprint (and baseline) its own.
        data = registration_body(
            sim,
            team=team,
            name=f"{ej.scenario} ({ej.variant})",
            model=f"sim-7b-{ej.job_id}",
            external_id=ej.job_id,
        )
        job = register_job(data).job
        if ej.baseline is not None:
            Baseline.objects.create(
                fingerprint=job.config_fingerprint,
                model_name=job.model_name,
                team=team,
                config={"scenario": BASELINE_SCENARIO},
                stats=ej.baseline,
            )
        return job

    def _progress(self, message: str) -> None:
        self.stderr.write(f"[evaluate_diagnosis] {message}")
        self.stderr.flush()


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    return str(value)
