"""The demo: every scenario is planned, the synthetic trace shows host syncs, the live exporter is valid."""

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobs import demo
from jobs.diagnosis import ArtifactAnalysis, diagnose
from jobs.diagnosis.testing import input_from_sim
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.trace_analysis import analyze_trace
from jobs.simulate import SCENARIOS

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def test_the_plan_covers_every_scenario_on_disjoint_hosts():
    plan = demo.plan(NOW)
    assert {d.spec.scenario for d in plan} >= set(SCENARIOS)
    hosts = [h for d in plan for h in d.spec.hosts]
    assert len(hosts) == len(set(hosts))
    assert len({d.spec.job_id for d in plan}) == len(plan)
    assert [d.spec.job_id for d in plan if not d.ended] == ["demo-4900", "demo-4901", "demo-4902"]


def test_the_synthetic_trace_yields_a_host_sync_finding():
    analysis = analyze_trace(parse_kineto(demo.host_sync_trace()))
    rank = analysis["ranks"][0]
    assert rank["sync"]["cpu_sync_calls"] == 5 * 4  # 4 per step; the last step is left out, as HTA does
    assert rank["step_times"]["count"] == 6
    spec = demo.plan(NOW)[0].spec
    from jobs.simulate import simulate

    inp = input_from_sim(simulate(spec), artifacts=[ArtifactAnalysis("kineto", analysis, "rank0.json", 0)])
    assert "host_sync" in {f.code for f in diagnose(inp)}


def test_the_live_exporter_serves_valid_exposition_text(tmp_path: Path):
    running = [d.spec for d in demo.plan(NOW) if not d.ended]
    (tmp_path / demo.LIVE_SPECS_FILE).write_text(json.dumps([_spec_dict(s) for s in running]))
    text = demo.live_exporter_text(tmp_path, running[0].start + 600)
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

    seeds = {d.spec.job_id: d for d in demo.plan(NOW) if d.spec.workload is not None}
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

    for d in (demo.plan(NOW)[0], next(d for d in demo.plan(NOW) if d.spec.workload is not None)):
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


@pytest.mark.parametrize(("job_id", "expected"), [("demo-seed1-run1", "data_pipeline_stall"),
                                                  ("demo-seed2", "communication_wait")])  # fmt: skip
def test_the_seed_traces_belong_to_their_run_and_name_the_seeds_cause(job_id, expected):
    from jobs.profiling.run_check import JobFacts, check_run
    from jobs.simulate import simulate

    d = next(d for d in demo.plan(NOW) if d.spec.job_id == job_id)
    doc = demo.SEED_TRACES[job_id](d.spec.start + 1800.0)
    assert len(doc) < 100_000  # small enough to ship with the demo
    analysis = analyze_trace(parse_kineto(doc))
    facts = JobFacts(d.spec.gpu_model, d.spec.gpus, d.spec.start, d.spec.start + d.spec.duration_s)
    check = check_run(analysis["capture"], facts, rank=0, now_unix=NOW.timestamp(), canonical_gpu=lambda n: n)
    assert check.status == "matches", check.mismatches
    rank = analysis["ranks"][0]
    if expected == "data_pipeline_stall":
        # 1.2 s of every 2 s step in the DataLoader with nothing queued on the GPU: 60 % of the step.
        assert rank["input_pipeline"]["dataloader_step_pct"] == pytest.approx(60.0)
        assert rank["gpu_idle_attribution"]["input_pct"] == pytest.approx(60.0)
    else:
        # 0.5 s all-reduce per 1.5 s step, nothing overlapping it.
        assert rank["comm_compute_overlap"]["overlap_pct"] == 0.0
    art = ArtifactAnalysis("kineto", analysis, "rank0.pt.trace.json", 0)
    found = diagnose(input_from_sim(simulate(d.spec), artifacts=[art]))
    top = next(f for f in found if f.code == expected)
    assert top.severity.rank >= 1 and "metrics" in top.sources and len(top.sources) >= 2
