"""The demo: every scenario is planned, the synthetic trace shows host syncs, the live exporter is valid."""

import io
import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from benchmarks.diagnosis_inputs import input_from_sim
from jobs.demo import cluster, live, loader, traces
from jobs.diagnosis import ArtifactAnalysis, diagnose
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.trace_analysis import analyze_trace
from jobs.simulate import SCENARIOS

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_the_plan_covers_every_scenario_on_disjoint_hosts():
    plan = cluster.plan(NOW)
    assert {d.spec.scenario for d in plan} >= set(SCENARIOS)
    hosts = [h for d in plan for h in d.spec.hosts]
    assert len(hosts) == len(set(hosts))
    assert len({d.spec.job_id for d in plan}) == len(plan)
    running = [d.spec.job_id for d in plan if not d.ended]
    assert running == ["demo-4900", "demo-4901", "demo-4902", "demo-4903"]  # 4903: the model server


def test_the_synthetic_trace_yields_a_host_sync_finding():
    analysis = analyze_trace(parse_kineto(traces.host_sync_trace()))
    rank = analysis["ranks"][0]
    assert rank["sync"]["cpu_sync_calls"] == 5 * 4  # 4 per step; the last step is left out, as HTA does
    assert rank["step_times"]["count"] == 6
    spec = cluster.plan(NOW)[0].spec
    from jobs.simulate import simulate

    inp = input_from_sim(simulate(spec), artifacts=[ArtifactAnalysis("kineto", analysis, "rank0.json", 0)])
    assert "host_sync" in {f.code for f in diagnose(inp)}


def test_the_live_exporter_serves_valid_exposition_text(tmp_path: Path):
    running = [d.spec for d in cluster.plan(NOW) if not d.ended]
    (tmp_path / live.LIVE_SPECS_FILE).write_text(json.dumps([_spec_dict(s) for s in running]))
    text = live.live_exporter_text(tmp_path, running[0].start + 600)
    assert "DCGM_FI_DEV_GPU_UTIL{" in text and 'train_tokens_total{job_id="demo-4900"' in text
    try:
        result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                                timeout=30)  # fmt: skip
    except FileNotFoundError:
        pytest.skip("promtool is not installed (Debian package 'prometheus')")
    assert "parsing error" not in (result.stdout + result.stderr), result.stdout + result.stderr


def _spec_dict(spec) -> dict:
    from dataclasses import asdict

    return asdict(spec) | {"disabled": sorted(spec.disabled)}


@pytest.mark.django_db
def test_the_exporter_endpoint_is_off_unless_configured(client, settings, tmp_path):
    settings.DEMO_STATE_DIR = ""
    assert client.get("/simulated/dcgm-exporter/metrics").status_code == 404
    settings.DEMO_STATE_DIR = str(tmp_path)
    response = client.get("/simulated/dcgm-exporter/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")


def test_the_seed_case_studies_are_in_the_demo_and_get_the_seeds_diagnosis():
    from jobs.simulate import simulate
    from jobs.simulate.seeds import SEED_CASES

    seeds = {d.spec.job_id: d for d in cluster.plan(NOW) if d.spec.workload is not None}
    assert set(seeds) == {f"demo-{name}" for name in SEED_CASES}
    assert seeds["demo-seed1-run1"].kind == "fine_tuning" and seeds["demo-seed2"].spec.gpus == 32
    for job_id, d in seeds.items():
        case = SEED_CASES[job_id.removeprefix("demo-")]
        assert d.spec.exporter is not None and d.spec.exporter.scrape_s == 15.0
        found = diagnose(input_from_sim(simulate(d.spec)))
        warned = {f.code for f in found if f.severity.rank >= 1}
        # Case 1 run 1 -> input side, run 2 -> tiny kernels, run 3 -> nothing to warn about, case 2 ->
        # collectives (seed 002, section 4).
        assert warned == ({case.expected} if case.expected else set()), (job_id, warned)


def test_demo_jobs_register_a_full_model_shape_and_their_mfu_evaluates_as_simulated():
    from jobs.evaluation.kpis import ModelShape
    from jobs.simulate import registration_body, simulate

    for d in (cluster.plan(NOW)[0], next(d for d in cluster.plan(NOW) if d.spec.workload is not None)):
        res = simulate(d.spec)
        model = dict(registration_body(res, team="t")["model"])
        assert {"n_layers", "n_heads", "head_dim", "hidden", "seq_len"} <= set(model)
        model.pop("name")
        estimate, fallback = ModelShape.from_config(model, "none").model_flops("palm")
        # The organisation's PaLM convention (6N + 12·L·H·Q·T) on the registered shape is exactly the FLOPs
        # per token the simulator generated its token rate with: a simulated MFU of x is evaluated as x.
        assert not fallback and estimate is not None
        assert estimate.flops_per_token == res.throughput.flops_per_token
        tps = res.throughput.tokens_per_s.mean()
        mfu = tps * estimate.flops_per_token / (len(res.gpus) * res.throughput.peak_flops_per_gpu)
        assert mfu == pytest.approx(res.throughput.mfu)


SEED_RUNS = [
    # job id, the finding its trace and metrics name ("" = no warning), step time of its workload (s)
    ("demo-seed1-run1", "data_pipeline_stall", 2.0),
    ("demo-seed1-run2", "launch_overhead", 0.97),
    ("demo-seed1-run3", "", 0.78),
    ("demo-seed2", "communication_wait", 1.5),
    ("demo-seed2-run2", "", 1.05),
]


@pytest.mark.parametrize(("job_id", "expected", "step_s"), SEED_RUNS)
def test_every_seed_run_has_a_trace_of_its_own_step_that_names_the_seeds_cause(job_id, expected, step_s):
    from jobs.profiling.run_check import JobFacts, check_run

    d = next(d for d in cluster.plan(NOW) if d.spec.job_id == job_id)
    assert d.spec.workload is not None and d.spec.workload.step_s == pytest.approx(step_s)
    doc = traces.SEED_TRACES[job_id](d.spec.start + 1800.0)
    assert len(doc) < 2_000_000  # small enough to generate and parse while the demo loads
    analysis = analyze_trace(parse_kineto(doc))
    facts = JobFacts(d.spec.gpu_model, d.spec.gpus, d.spec.start, d.spec.start + d.spec.duration_s)
    check = check_run(analysis["capture"], facts, rank=0, now_unix=NOW.timestamp(), canonical_gpu=lambda n: n)
    assert check.status == "matches", check.mismatches
    rank = analysis["ranks"][0]
    # The trace's steps are the metrics' steps: the compare page reads step time from here.
    assert rank["step_times"]["count"] == 3
    assert rank["step_times"]["median_ms"] == pytest.approx(step_s * 1000.0)
    attribution = rank["gpu_idle_attribution"]
    if expected == "data_pipeline_stall":
        # 1.2 s of every 2 s step in the DataLoader with nothing queued on the GPU: 60 % of the step.
        assert rank["input_pipeline"]["dataloader_step_pct"] == pytest.approx(60.0)
        assert attribution["input_pct"] == pytest.approx(60.0)
    elif expected == "launch_overhead":
        # 770 optimizer kernels of 1-3 us, each after ~0.4 ms of host time: ~32 % of the step idle in
        # launch gaps (the seed's 68 % busy), nearly all kernels tiny.
        assert attribution["launch_gaps_pct"] == pytest.approx(31.6, abs=0.5)
        assert attribution["input_pct"] < 1.0
        assert rank["kernel_breakdown"]["tiny_kernels"]["count_pct"] > 90.0
    elif job_id == "demo-seed2":
        # 0.5 s all-reduce per 1.5 s step, nothing overlapping it.
        assert rank["comm_compute_overlap"]["overlap_pct"] == 0.0
    elif job_id == "demo-seed2-run2":
        # The same 0.5 s of all-reduce, 0.45 s of it in buckets beside the backward GEMMs.
        assert rank["comm_compute_overlap"]["overlap_pct"] == pytest.approx(90.0, abs=0.5)
    else:
        # Fused: 85 % busy (the seed's run 3); what idles is host time outside the loader, no launch gaps.
        assert 100.0 - attribution["idle_pct"] == pytest.approx(85.4, abs=0.5)
        assert attribution["launch_gaps_pct"] < 1.0 and attribution["input_pct"] < 1.0
    art = ArtifactAnalysis("kineto", analysis, "rank0.pt.trace.json", 0)
    found = diagnose(input_from_sim(cluster.simulate_job(d, NOW), artifacts=[art]))
    warned = {f.code for f in found if f.severity.rank >= 1}
    assert warned == ({expected} if expected else set()), [(f.code, f.severity) for f in found]
    if expected:
        top = next(f for f in found if f.code == expected)
        assert "metrics" in top.sources and len(top.sources) >= 2


def test_seed_throughput_is_tokens_per_step_over_the_step_time():
    """Issue 28 item 5: run 1 -> run 2 of case 1 halves the step (2 s -> 0.97 s), so tokens/s doubles
    (the simulator's tensor-derived rate rose 27 %); MFU follows the rate and stays under the hardware's
    tensor-activity upper estimate."""
    runs = {d.spec.job_id: d for d in cluster.plan(NOW) if d.batch is not None}
    assert set(runs) == {job_id for job_id, _, _ in SEED_RUNS}
    rate, mfu = {}, {}
    for job_id, _, step_s in SEED_RUNS:
        d = runs[job_id]
        res = cluster.simulate_job(d, NOW)
        tp = res.throughput
        assert d.batch is not None
        assert tp.tokens_per_s == pytest.approx(d.batch.tokens_per_step / step_s)
        # The counter the training loop exports grows by the rate times the scrape interval.
        assert tp.tokens_total[-1] - tp.tokens_total[0] == pytest.approx(
            tp.tokens_per_s[0] * (res.timestamps[-1] - res.timestamps[0])
        )
        rate[job_id] = float(tp.tokens_per_s.mean())
        mfu[job_id] = tp.mfu
        assert mfu[job_id] == pytest.approx(
            rate[job_id] * tp.flops_per_token / (len(res.gpus) * tp.peak_flops_per_gpu)
        )
        # Tensor active x clock (the cross-check's upper estimate) is at or above MFU, within 25 %.
        tensor = float(np.nanmean(res.fields["tensor_active"]))
        assert mfu[job_id] <= tensor * 0.98 * 1.02 and mfu[job_id] >= tensor * 0.98 / 1.25, (job_id, tensor)
    assert rate["demo-seed1-run2"] / rate["demo-seed1-run1"] == pytest.approx(2.0 / 0.97)
    assert rate["demo-seed1-run3"] / rate["demo-seed1-run1"] == pytest.approx(2.0 / 0.78)
    assert rate["demo-seed2-run2"] / rate["demo-seed2"] == pytest.approx(1.5 / 1.05)
    # Whole sequences per rank: the registered micro and global batches describe the same tokens.
    for d in runs.values():
        assert d.batch is not None and d.batch.sequences % d.spec.gpus == 0


def test_step_throughput_refuses_a_job_without_a_step():
    from jobs.simulate import simulate

    plain = cluster.plan(NOW)[0]
    with pytest.raises(ValueError, match="no step time"):
        cluster.step_throughput(simulate(plain.spec), cluster.SeedBatch(8, 2048))


# ------------------------------------------------------------------ issue 28 item 3: no stale alerts at start


class _FakeProm:
    """Answers the newest-sample query with what Prometheus holds at each call (a scrape per call)."""

    def __init__(self, answers: list[dict[str, float]]) -> None:
        self.answers = answers
        self.queries: list[str] = []

    def instant(self, query: str):
        from jobs.metrics.prometheus import Sample

        self.queries.append(query)
        latest = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [Sample({"hpc_job": job}, 1e9, ts) for job, ts in latest.items()]


def test_finish_waits_until_every_running_job_was_scraped_after_it_began():
    began = 1_000.0
    # Backfilled data ends before `finish` began; the exporter's scrapes arrive one job at a time.
    prom = _FakeProm([{"a": 900.0, "b": 900.0}, {"a": 1_010.0, "b": 900.0}, {"a": 1_010.0, "b": 1_012.0}])
    slept: list[float] = []
    clock = iter(range(2_000, 3_000)).__next__
    ok = loader.wait_for_live_data(
        prom, ["a", "b"], began, timeout_s=60, sleep=slept.append, clock=lambda: float(clock())
    )
    assert ok and len(prom.queries) == 3 and slept == [5.0, 5.0]
    assert prom.queries[0] == 'max by (hpc_job) (timestamp(DCGM_FI_DEV_GPU_UTIL{hpc_job=~"a|b"}))'


def test_finish_gives_up_waiting_with_the_reason_when_nothing_is_scraped():
    prom = _FakeProm([{"a": 900.0}])
    lines: list[str] = []
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    ok = loader.wait_for_live_data(prom, ["a", "b"], 1_000.0, timeout_s=20, progress=lines.append,
                                   sleep=sleep, clock=lambda: now[0])  # fmt: skip
    assert not ok and now[0] == 20.0
    assert lines and "has not scraped a, b from the simulated exporter in 20 s" in lines[-1]


@pytest.mark.django_db
def test_load_backfills_the_running_jobs_last_up_to_their_own_backfill_and_says_so(monkeypatch, tmp_path):
    """The running jobs' data must end when it is written, not when `load` began: the history's backfill
    takes minutes, and data that old at the first poll opened the demo with "Ingestion stale" alerts."""
    from django.core.management import call_command

    plan = cluster.plan(NOW)
    small = [plan[0], next(d for d in plan if not d.ended)]
    monkeypatch.setattr(loader, "plan", lambda now: small)
    clock = [100.0]
    monkeypatch.setattr(loader.time, "monotonic", lambda: clock[0])
    written: list[tuple[str, float]] = []

    def fake_backfill(results, tsdb_dir, progress):
        for r in results:
            written.append((r.spec.job_id, float(r.timestamps[-1])))
        clock[0] += 420.0  # promtool takes 7 minutes on a busy machine

    monkeypatch.setattr(loader, "backfill_results", fake_backfill)
    monkeypatch.setattr(loader, "register", lambda *a, **k: None)
    out = io.StringIO()
    report = loader.load(
        tmp_path / "tsdb", tmp_path / "state", now=NOW, progress=lambda line: out.write(line + "\n")
    )
    assert report["jobs_created"] == 2
    (ended_id, _), (live_id, live_last) = written
    assert ended_id == small[0].spec.job_id and live_id == small[1].spec.job_id
    # The running job's samples reach `now` plus the 7 minutes the history took, within one sample.
    assert NOW.timestamp() + 420.0 - small[1].spec.step_s <= live_last <= NOW.timestamp() + 420.0
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "simulate",
        "backfill",
        "simulate and backfill",
        "register",
    ]
    # The command prints each phase with the time since it started.
    monkeypatch.setattr(loader, "load", lambda tsdb, state, progress: progress("backfill: 10/60 jobs written")
                        or {"jobs_created": 0, "jobs_existing": 0, "live_jobs": 0})  # fmt: skip
    cmd_out = io.StringIO()
    call_command("load_demo", tsdb=str(tmp_path / "tsdb"), state_dir=str(tmp_path / "state"), stdout=cmd_out)
    assert re.match(r"\[ +\d+\.\d s\] backfill: 10/60 jobs written$", cmd_out.getvalue().splitlines()[0])


@pytest.mark.django_db
def test_finish_polls_only_after_the_wait_and_reports_each_phase(monkeypatch):
    from jobs.models import Job, Team

    team = Team.objects.create(slug="t", name="T")
    Job.objects.create(external_id="demo-4900", team=team, name="live", model_name="m",
                       gpu_model_name="NVIDIA H100 80GB HBM3", gpu_count=8, started_at=NOW,
                       status=Job.Status.RUNNING, registered_by=Job.Provenance.DEMO)  # fmt: skip
    calls: list[str] = []

    def fake_wait(client, job_ids, since, timeout_s, progress):
        calls.append(f"wait {job_ids} {timeout_s:g}")
        return True

    monkeypatch.setattr(loader, "wait_for_live_data", fake_wait)
    monkeypatch.setattr(loader, "ingest_once", lambda client: calls.append("ingest") or
                        {"polled": ["demo-4900"], "finalized": [], "stale": []})  # fmt: skip
    lines: list[str] = []
    report = loader.finish(lines.append, wait_live_s=30, client=object())  # type: ignore[arg-type]
    assert calls == ["wait ['demo-4900'] 30", "ingest"] and report["live_caught_up"]
    phases = [line.split(":")[0] for line in lines]
    assert phases == ["live data", "ingest", "ingest", "traces", "baselines", "diagnosis"]


# ------------------------------------------------------- issue 28 item 6: one number, one definition per page


def _card(doc: bytes, drop_attribution: bool = False):
    from jobs.views.artifacts import ArtifactView, _trace

    analysis = analyze_trace(parse_kineto(doc))
    if drop_attribution:  # an analysis from before the per-step attribution existed
        for rank in analysis["ranks"]:
            rank.pop("gpu_idle_attribution", None)
    view = ArtifactView(artifact=None)  # type: ignore[arg-type]
    _trace(view, analysis)
    return analysis, {label: (value, definition) for label, value, definition in view.facts}


def test_the_trace_card_shows_gpu_idle_as_the_finding_does():
    """The card showed "GPU idle 57.1 %" (share of the GPU span) beside the finding's "GPU idle: 70 % of
    step": now one number with one definition, and busy and idle add up to the step."""
    d = next(d for d in cluster.plan(NOW) if d.spec.job_id == "demo-seed1-run1")
    analysis, facts = _card(traces.seed_input_trace(d.spec.start + 1800.0))
    value, definition = facts["GPU idle (rank 0)"]
    assert value == "70 % of the step" and "the findings' definition" in definition
    assert "waiting for input 60 %" in definition and "other 10 %" in definition
    assert facts["Compute kernels (rank 0)"][0] == "30 % of the step"
    assert "GPU idle" not in facts  # the span-based share is not shown beside it
    art = ArtifactAnalysis("kineto", analysis, "rank0.pt.trace.json", 0)
    found = diagnose(input_from_sim(cluster.simulate_job(d, NOW), artifacts=[art]))
    stall = next(f for f in found if f.code == "data_pipeline_stall")
    idle = [e for e in stall.evidence if e.label.endswith("GPU idle")]
    assert [(e.value, e.unit) for e in idle] == [(70.0, "% of step")]


def test_host_wait_is_a_share_of_the_span_not_of_a_tiny_idle_time():
    """A communication-bound trace showed "Idle waiting for the host 100.0 %" with 0.2 % idle."""
    _, facts = _card(traces.seed_collective_trace(1.7e9), drop_attribution=True)
    idle, _ = facts["GPU idle"]
    value, definition = facts["Idle waiting for the host"]
    assert idle == "0.17 %" and value == "0.17 % of the span"
    assert definition.startswith("100 % of the 0.17 % idle")
    # With the attribution: the collective is communication, not idle, in the step's own unit.
    _, facts = _card(traces.seed_collective_trace(1.7e9))
    assert facts["GPU idle (rank 0)"][0] == "0.173 % of the step"
    assert facts["Communication (rank 0)"][0] == "33.3 % of the step"


def test_energy_and_gpu_hours_are_not_called_computed_from_price_and_energy_has_one_format():
    from jobs.outputs.compare import KPI_BY_KEY, Value, kpi_rows
    from jobs.outputs.numbers import format_number

    keys = ("energy_kwh", "gpu_hours", "cost_per_day")
    rows = {
        r["key"]: r
        for r in kpi_rows(
            {"energy_kwh": Value(1.84), "gpu_hours": Value(12.0), "cost_per_day": Value(659.0)},
            {"energy_kwh": Value(2.41), "gpu_hours": Value(12.0), "cost_per_day": Value(659.0)},
            {},
            [KPI_BY_KEY[k] for k in keys],
        )
    }
    assert "DCGM energy counter" in rows["energy_kwh"]["significance"]["detail"]
    assert rows["energy_kwh"]["significance"]["verdict"] == "not judged"
    assert rows["gpu_hours"]["significance"]["verdict"] == "not judged"
    assert (
        "price"
        not in rows["energy_kwh"]["significance"]["detail"] + rows["gpu_hours"]["significance"]["detail"]
    )
    assert rows["cost_per_day"]["significance"]["verdict"] == "not measured"  # dollars are computed
    # The compare page and the job page write energy alike: 1.84 and 2.41 kWh, not "2" and "2".
    assert (rows["energy_kwh"]["a_text"], rows["energy_kwh"]["b_text"]) == ("1.84 kWh", "2.41 kWh")
    assert format_number(1.84) == "1.84"
