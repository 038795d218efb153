"""The comparison of two runs through the database, the page and the API: the API's JSON is the page's,
its numbers are the stored evaluation's, findings and traces come from what the diagnosis uses, read rules
are the job pages', and bad requests get a clear 400 or 404. Jobs are built as ingestion leaves them:
stored evaluation (jobs.evaluation.store), archived series (jobs.metrics.archive), findings, artifacts."""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from jobs.evaluation.schema import Evaluation, WasteSplit
from jobs.evaluation.store import store
from jobs.intake.registry import fingerprint_for
from jobs.metrics.archive import rows_for, upsert
from jobs.metrics.signals import GpuKey, JobSignals, SignalSeries
from jobs.models import Artifact, Finding, GpuModel, Job
from tests.conftest import sample_path

START = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
STEP = 30
POINTS = 120  # one hour at 30 s


def _series(key: str, values: np.ndarray, per_gpu: np.ndarray | None = None, gpus: int = 8) -> SignalSeries:
    ts = START.timestamp() + STEP * np.arange(values.size, dtype=np.float64)
    s = SignalSeries(key, "ratio", ts, {"mean": values})
    if per_gpu is not None:
        s.per_gpu, s.gpu_timestamps = per_gpu, ts
        s.gpus = tuple(GpuKey(f"node-{i // 4}", str(i % 4)) for i in range(gpus))
    return s


def make_run(
    team: Any,
    external_id: str,
    *,
    mfu: float,
    tps: float,
    sm: float,
    offset_h: float = 0.0,
    waste: float | None = 812.0,
    straggler: bool = False,
    seed: int = 0,
    **job_fields: Any,
) -> Job:
    """A finished 8-GPU LoRA run with a stored evaluation and an hour of archived 30 s samples whose mean
    is the stored one (MFU, tokens/s, SM active, nvidia-smi util and per-GPU SM active)."""
    rng = np.random.default_rng(seed)
    started = START + timedelta(hours=offset_h)
    fields: dict[str, Any] = dict(
        external_id=external_id,
        name=f"lora {external_id}",
        team=team,
        model_name="llama-7b-lora",
        kind="fine_tuning",
        model_config={"n_params": 6.7e9, "seq_len": 4096},
        dtype="bf16",
        parallelism={"tp": 1, "pp": 1, "dp": 8, "ep": 1},
        micro_batch=4,
        global_batch=32,
        gpu_model=GpuModel.objects.get(name="A100 SXM 80GB"),
        gpu_count=8,
        started_at=started,
        ended_at=started + timedelta(hours=1),
        status=Job.Status.FINALIZED,
        last_polled_at=started,
    )
    fields.update(job_fields)
    job = Job(**fields)
    job.config_fingerprint = fingerprint_for(job)
    cost_day = 8 * 1.29 * 24
    ev = Evaluation(
        duration_s=3600.0,
        gpu_hours=8.0,
        mfu=mfu,
        hfu=mfu * 1.1,
        tokens_per_second=tps,
        gpu_util_mean=0.97,
        sm_active_mean=sm,
        tensor_active_mean=sm / 2,
        cost_usd=8 * 1.29,
        cost_per_day_usd=cost_day,
        waste=WasteSplit(
            total_per_day_usd=waste,
            lower_bound_per_day_usd=waste if waste is not None else 30.0,
            idle_per_day_usd=30.0,
            efficiency_per_day_usd=waste,
            unknown_reason="" if waste is not None else "MFU unknown (no throughput)",
        ),
        reference_mfu=0.45,
        reference_source="organisation target",
        flops_variant="MFU, 6N + 12·L·H·Q·T",
        energy_kwh=2.4,
        peak_memory_mib=60000.0,
        price_note="8 GPUs × $1.29/GPU-h (on_demand) × 24 h",
    )
    store(job, ev)
    job.save()
    noise = rng.normal(0, 0.01, POINTS)
    mfu_s = mfu + noise - noise.mean()
    per_gpu = np.clip(sm + rng.normal(0, 0.01, (8, POINTS)), 0, 1)
    if straggler:
        per_gpu[5] -= 0.2
    sigs = JobSignals(
        START.timestamp() + offset_h * 3600,
        START.timestamp() + offset_h * 3600 + STEP * (POINTS - 1),
        STEP,
        START.timestamp() + offset_h * 3600 + STEP * np.arange(POINTS, dtype=np.float64),
    )
    shift = offset_h * 3600
    for key, values, gpus in (
        ("sm_active", per_gpu.mean(axis=0), per_gpu),
        ("gpu_util", np.full(POINTS, 0.97), None),
        ("power_usage", np.full(POINTS, 300.0 + 100 * sm), None),
    ):
        s = _series(key, values, gpus)
        s.timestamps = s.timestamps + shift
        if s.gpu_timestamps is not None:
            s.gpu_timestamps = s.gpu_timestamps + shift
        sigs.signals[key] = s
    derived = {"mfu": mfu_s, "tokens_per_second": tps * mfu_s / mfu}
    upsert(rows_for(job, sigs, derived))
    return job


def add_trace(job: Job, sample: str, rank: int, **extra: Any) -> Artifact:
    from jobs.profiling import kineto, trace_analysis

    analysis = trace_analysis.analyze_trace(kineto.parse_kineto(sample_path(f"kineto/{sample}")))
    fields: dict[str, Any] = dict(
        job=job,
        kind=Artifact.Kind.KINETO,
        rank=rank,
        original_name=sample,
        sha256=f"{job.pk:08d}{sample}"[:64],
        size_bytes=1,
        status=Artifact.Status.DONE,
        analysis=json.loads(json.dumps(analysis, default=str)),
        run_check=Artifact.RunCheck.MATCHES,
        parsed_at=START,
    )
    fields.update(extra)
    return Artifact.objects.create(**fields)


def finding(job: Job, code: str, usd: float | None, title: str = "") -> Finding:
    return Finding.objects.create(
        job=job,
        code=code,
        severity="warning",
        confidence=0.8,
        title=title or code,
        evidence=[],
        recommendation="fix it",
        waste_per_day_usd=usd,
    )


@pytest.fixture
def pair(catalog, make_team) -> tuple[Job, Job]:
    """Seed case 1 in miniature: run 1 input-bound (MFU 33 %), run 2 after the input fix (68 %)."""
    team = make_team("llm")
    a = make_run(team, "lora-run1", mfu=0.33, tps=16000.0, sm=0.40, waste=1500.0, seed=1, straggler=True)
    b = make_run(team, "lora-run2", mfu=0.68, tps=33000.0, sm=0.80, waste=300.0, seed=2, offset_h=2)
    finding(a, "data_pipeline_stall", 1100.0, "Input stall")
    finding(a, "false_saturation", None, "Busy, not saturated")
    finding(a, "launch_overhead", 200.0, "Tiny kernels")
    finding(b, "launch_overhead", 250.0, "Tiny kernels")
    return a, b


@pytest.fixture
def member(make_user, make_team):
    return make_user("alice", teams=[make_team("llm")])


def page_data(response) -> dict[str, Any]:
    match = re.search(
        rb'<script id="compare-data" type="application/json">(.*?)</script>', response.content, re.S
    )
    assert match, "the page carries its data in json_script"
    return json.loads(match.group(1))


def cell(content: str, kpi: str, side: str) -> str:
    row = re.search(rf'<tr data-kpi="{kpi}">(.*?)</tr>', content, re.S)
    assert row, kpi
    td = re.search(rf'<td[^>]*data-side="{side}"[^>]*><span class="v">(.*?)</span>', row.group(1), re.S)
    assert td, (kpi, side)
    return html.unescape(td.group(1)).strip()


@pytest.mark.django_db
def test_the_api_json_equals_the_pages_numbers(client, member, api_client_for, pair):
    a, b = pair
    add_trace(a, "hta_128rank_sampled_rank0.json.gz", 0)
    add_trace(b, "hta_128rank_sampled_rank1.json.gz", 1)
    client.force_login(member)
    page = client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id})
    assert page.status_code == 200
    api = api_client_for(member).get("/api/v1/jobs/compare/", {"a": a.external_id, "b": b.external_id})
    assert api.status_code == 200
    body = api.json()
    assert page_data(page)["comparison"] == body
    content = page.content.decode()
    for row in body["kpis"]:
        assert cell(content, row["key"], "a") == row["a_text"], row["key"]
        assert cell(content, row["key"], "b") == row["b_text"], row["key"]
        assert cell(content, row["key"], "delta") == row["delta_text"], row["key"]
    # The key figures are the stored evaluation's: MFU 33.0 % -> 68.0 %, +35.0 pts, beyond noise.
    mfu = next(r for r in body["kpis"] if r["key"] == "mfu")
    assert (mfu["a"], mfu["b"], mfu["a_text"], mfu["b_text"], mfu["delta_text"]) == (
        a.mfu,
        b.mfu,
        "33.0 %",
        "68.0 %",
        "+35.0 pts",
    )
    assert mfu["significance"]["verdict"] == "better" and mfu["significance"]["method"] == "samples"
    tps = next(r for r in body["kpis"] if r["key"] == "tokens_per_second_per_gpu")
    assert (tps["a"], tps["b"]) == (16000.0 / 8, 33000.0 / 8)
    waste = next(r for r in body["kpis"] if r["key"] == "waste_per_day")
    assert (waste["a_text"], waste["b_text"], waste["delta_text"]) == (
        "$1,500/day",
        "$300/day",
        "−$1,200/day",
    )
    # Total waste = $/day × duration (8 GPU-h on 8 GPUs = 1 h): $1,500 / 24 = $62.50, $300 / 24 = $12.50.
    total = next(r for r in body["kpis"] if r["key"] == "waste_usd")
    assert (total["a_text"], total["b_text"]) == ("$62.50 total", "$12.50 total")
    assert total["delta_text"] == "−$50.00 total"
    # Nothing changed in the config, and the page says which run is before.
    assert body["config"]["changed"] == [] and body["config"]["comparable"]
    assert body["before"] == a.external_id and "A · before" in content
    # The trace diff's numbers are on the page as in the JSON.
    idle = next(r for r in body["traces"]["temporal"] if r["key"] == "idle_pct")
    assert body["traces"]["available"] and f"{idle['delta']:.3f}" in content


@pytest.mark.django_db
def test_the_payload_matches_the_documented_schema(client, member, api_client_for, pair):
    from jobs.api.compare import ComparisonSerializer

    a, b = pair
    body = (
        api_client_for(member).get("/api/v1/jobs/compare/", {"a": a.external_id, "b": b.external_id}).json()
    )
    serializer = ComparisonSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    client.force_login(member)
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").content.decode()
    assert "/api/v1/jobs/compare/" in schema and "Comparison" in schema


@pytest.mark.django_db
def test_findings_diff_with_dollars(client, member, pair):
    a, b = pair
    client.force_login(member)
    c = page_data(client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id}))["comparison"]
    f = c["findings"]
    assert [i["code"] for i in f["resolved"]] == ["data_pipeline_stall", "false_saturation"]
    assert f["new"] == [] and f["persisting"][0]["delta_usd_per_day"] == 50.0
    assert f["totals"]["resolved"]["text"] == "$1,100/day + 1 of unknown impact"


@pytest.mark.django_db
def test_per_gpu_comparison_names_the_straggler(client, member, pair):
    a, b = pair
    client.force_login(member)
    c = page_data(client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id}))
    gpus = c["comparison"]["per_gpu"]
    assert gpus["a"]["signal"] == "sm_active" and gpus["a"]["gpus"] == 8
    assert [s["gpu"] for s in gpus["a"]["stragglers"]] == ["node-1/1"] and gpus["b"]["stragglers"] == []
    fig = c["figures"]["per_gpu"]
    assert [t["meta"]["run"] for t in fig["data"]] == ["a", "b"]


@pytest.mark.django_db
def test_both_runs_share_one_relative_time_axis(client, member, pair):
    a, b = pair  # B started two hours after A
    client.force_login(member)
    fig = page_data(client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id}))["figures"][
        "overlay"
    ]
    mfu = [t for t in fig["data"] if t["meta"]["key"] == "mfu"]
    assert [t["meta"]["run"] for t in mfu] == ["a", "b"] and {t["yaxis"] for t in mfu} == {"y"}
    # Hours since each run's start: both start at 0 and end at 119 × 30 s = 0.9917 h.
    for t in mfu:
        assert t["x"][0] == 0 and t["x"][-1] == pytest.approx(0.9917, abs=1e-4)
    assert fig["layout"]["xaxis"]["title"]["text"] == "hours since the run started"


@pytest.mark.django_db
def test_trace_diff_uses_only_traces_used_in_the_diagnosis(client, member, pair):
    a, b = pair
    add_trace(a, "hta_128rank_sampled_rank0.json.gz", 0)
    add_trace(b, "hta_128rank_sampled_rank1.json.gz", 1)
    # An excluded trace of B is newer but must not be used.
    add_trace(b, "hta_alexnet_a100.json.gz", 0, excluded_at=START, parsed_at=START + timedelta(hours=5))
    client.force_login(member)
    t = page_data(client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id}))["comparison"][
        "traces"
    ]
    assert t["available"] and t["b"]["name"] == "hta_128rank_sampled_rank1.json.gz"
    idle = next(r for r in t["temporal"] if r["key"] == "idle_pct")
    # rank 0 idle 53.5578 %, rank 1 54.717 % (their own temporal breakdowns): +1.1592 points.
    assert idle["delta"] == pytest.approx(54.717 - 53.5578, abs=1e-4)


@pytest.mark.django_db
def test_no_trace_of_the_same_kind_says_so(client, member, pair):
    a, b = pair
    client.force_login(member)
    t = page_data(client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id}))["comparison"][
        "traces"
    ]
    assert not t["available"] and "A: none; B: none" in t["reason"]


@pytest.mark.django_db
def test_different_gpu_models_and_unknown_mfu_are_stated(client, member, catalog, make_team):
    team = make_team("llm")
    a = make_run(team, "a100-run", mfu=0.4, tps=20000.0, sm=0.5)
    b = make_run(
        team,
        "h100-run",
        mfu=0.3,
        tps=20000.0,
        sm=0.5,
        offset_h=2,
        waste=None,
        gpu_model=GpuModel.objects.get(name="H100 SXM"),
    )
    Job.objects.filter(pk=b.pk).update(mfu=None)
    client.force_login(member)
    response = client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id})
    c = page_data(response)["comparison"]
    assert not c["config"]["comparable"]
    assert any("different GPU models (A100 SXM 80GB vs H100 SXM)" in w for w in c["config"]["warnings"])
    assert "Not like for like" in response.content.decode()
    mfu = next(r for r in c["kpis"] if r["key"] == "mfu")
    assert mfu["b"] is None and mfu["b_text"] == "unknown" and mfu["delta"] is None
    waste = next(r for r in c["kpis"] if r["key"] == "waste_per_day")
    assert waste["b_text"] == "at least $30.00/day" and waste["b_reason"] == "MFU unknown (no throughput)"


@pytest.mark.django_db
def test_a_baselines_spread_is_the_noise_when_the_config_has_one(client, member, catalog, make_team):
    from jobs.models import Baseline

    team = make_team("llm")
    a = make_run(team, "base-1", mfu=0.40, tps=20000.0, sm=0.5)
    b = make_run(team, "base-2", mfu=0.45, tps=21000.0, sm=0.5, offset_h=2)
    # Baseline of the config over three runs at 40, 42, 44 % MFU: σ = 1.4826 × 2 pts = 2.97 pts; the band
    # around A is max(3σ = 8.9 pts, 5 % of 40 %) -> +5 pts is within run-to-run noise.
    baseline = Baseline.objects.create(
        fingerprint=a.config_fingerprint,
        model_name="llama-7b-lora",
        team=team,
        stats={"mfu": {"median": 0.42, "mad": 0.029652, "iqr": 0.02, "n": 3, "min": 0.40, "max": 0.44}},
    )
    baseline.runs.add(a)
    client.force_login(member)
    c = page_data(client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id}))["comparison"]
    mfu = next(r for r in c["kpis"] if r["key"] == "mfu")
    assert mfu["significance"]["method"] == "baseline" and mfu["significance"]["verdict"] == "within noise"
    assert mfu["significance"]["band_half_width"] == pytest.approx(0.088956)
    assert c["baseline"]["fingerprint"] == a.config_fingerprint


@pytest.mark.django_db
def test_read_rules_are_the_job_pages(client, make_user, make_team, api_client_for, pair):
    a, b = pair
    query = {"a": a.external_id, "b": b.external_id}
    # Not logged in: the login page (pages) or 401/403 (API), as for job pages.
    response = client.get("/jobs/compare/", query)
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert client.get("/api/v1/jobs/compare/", query).status_code in (401, 403)
    # Anyone logged in may read every team's jobs (the read policy), members of another team included.
    outsider = make_user("bob", teams=[make_team("vision")])
    client.force_login(outsider)
    assert client.get("/jobs/compare/", query).status_code == 200
    assert client.get(f"/jobs/{a.external_id}/").status_code == 200
    assert api_client_for(outsider).get("/api/v1/jobs/compare/", query).status_code == 200


@pytest.mark.django_db
def test_bad_ids_get_a_clear_404_and_the_same_id_twice_a_clear_400(client, member, api_client_for, pair):
    a, _ = pair
    client.force_login(member)
    api = api_client_for(member)
    page = client.get("/jobs/compare/", {"a": a.external_id, "b": "no-such-job"})
    assert (
        page.status_code == 404 and "no job with external id &#x27;no-such-job&#x27;" in page.content.decode()
    )
    answer = api.get("/api/v1/jobs/compare/", {"a": "nope<script>", "b": a.external_id})
    assert answer.status_code == 404 and answer.json() == {"detail": "no job with external id 'nope<script>'"}
    page = client.get("/jobs/compare/", {"a": a.external_id, "b": a.external_id})
    assert page.status_code == 400 and "are the same job" in page.content.decode()
    answer = api.get("/api/v1/jobs/compare/", {"a": a.external_id, "b": a.external_id})
    assert answer.status_code == 400 and "are the same job ('lora-run1')" in answer.json()["detail"]
    answer = api.get("/api/v1/jobs/compare/", {"a": a.external_id})
    assert answer.status_code == 400 and "two jobs are needed" in answer.json()["detail"]
    # No ids at all: the page is the form to choose two runs.
    empty = client.get("/jobs/compare/")
    assert empty.status_code == 200 and 'name="a"' in empty.content.decode()


@pytest.mark.django_db
def test_names_from_users_are_escaped(client, member, pair):
    a, b = pair
    Job.objects.filter(pk=a.pk).update(name='<img src=x onerror="alert(1)">')
    client.force_login(member)
    content = client.get("/jobs/compare/", {"a": a.external_id, "b": b.external_id}).content.decode()
    assert '<img src=x onerror="alert(1)">' not in content
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in content


@pytest.mark.django_db
def test_the_job_page_links_to_comparisons(client, member, pair):
    a, b = pair
    client.force_login(member)
    content = client.get(f"/jobs/{b.external_id}/").content.decode()
    section = content[content.index('id="compare"') :]
    # The previous run with the same config, as the run before this one.
    assert f"/jobs/compare/?a={a.external_id}&amp;b={b.external_id}" in section
    assert "previous run with this config" in section
    assert f'name="b" value="{b.external_id}"' in section
    assert (
        f"/jobs/compare/?a={a.external_id}&amp;b={b.external_id}"
        in client.get(f"/jobs/{a.external_id}/").content.decode()
    )


def test_the_overlay_leaves_out_rows_without_data_and_names_them():
    from jobs.charts.compare import overlay_figure

    t = np.arange(4) * 30.0
    fig = overlay_figure(
        {"mfu": (t, np.full(4, 0.3))},
        {"mfu": (t, np.full(4, 0.6)), "sm_clock": (t, np.full(4, np.nan))},
        ("run <1>", "run 2"),
    )
    assert [d["meta"]["run"] for d in fig["data"]] == ["a", "b"]
    # MFU in %: 30.0 and 60.0; x in hours: 0, 30 s = 0.0083 h, ...
    assert fig["data"][0]["y"] == [30.0] * 4 and fig["data"][1]["x"][1] == pytest.approx(0.0083, abs=1e-4)
    assert "SM clock" in fig["missing"] and "MFU" not in fig["missing"]
    assert fig["data"][0]["name"] == "A (before): run &lt;1&gt;"
    assert fig["layout"]["xaxis"]["anchor"] == "y"


#: The README's compare links of the demo's seed cases (before, after, the step times of their workloads).
DEMO_SEED_PAIRS = (
    ("demo-seed1-run1", "demo-seed1-run2", 2.0, 0.97),
    ("demo-seed1-run2", "demo-seed1-run3", 0.97, 0.78),
    ("demo-seed2", "demo-seed2-run2", 1.5, 1.05),
)


@pytest.mark.prometheus
@pytest.mark.django_db
def test_the_demos_seed_runs_compare_with_a_full_trace_diff(settings, tmp_path, capsys):
    """The demo's seed runs (jobs.demo: case 1 as three runs of one LoRA fine-tune, 33 -> 68 -> 85 %; case
    2 before and after its collective was overlapped) through the demo's own path: simulated dcgm-exporter
    data backfilled into a real Prometheus, registered, finalized, every run's trace attached
    (loader.finish). Issue 28 item 5: every README compare link has a trace diff and a known step time, and
    tokens/s changes as the step time does (tokens per step / step time)."""
    from jobs.demo import cluster, loader
    from jobs.outputs.compare_data import build
    from tests.prom_server import PrometheusProcess, prometheus_binary

    if prometheus_binary() is None:
        pytest.skip("prometheus is not installed (Debian package 'prometheus')")
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    wanted = {x for pair in DEMO_SEED_PAIRS for x in pair[:2]}
    planned = [d for d in cluster.plan(now) if d.spec.job_id in wanted]
    assert len(planned) == len(wanted)
    results = [cluster.simulate_job(d, now) for d in planned]
    loader.backfill_results(results, tmp_path / "tsdb")
    settings.MEDIA_ROOT = str(tmp_path / "media")
    with PrometheusProcess(tmp_path / "tsdb") as server:
        settings.PROMETHEUS_URL = server.url
        teams = cluster.ensure_people()
        for d, result in zip(planned, results, strict=True):
            cluster.register(d, result, teams, now)
        loader.finish(wait_live_s=0)
    for a_id, b_id, step_a, step_b in DEMO_SEED_PAIRS:
        run_a, run_b = (Job.objects.get(external_id=x) for x in (a_id, b_id))
        c = build(run_a, run_b).comparison
        kpis = {r["key"]: r for r in c["kpis"]}
        with capsys.disabled():
            print(f"\n{a_id} -> {b_id}:")
            for key in ("mfu", "tokens_per_second_per_gpu", "step_time_ms", "sm_active", "gpu_util",
                        "waste_per_day", "cost_per_day"):  # fmt: skip
                r = kpis[key]
                print(
                    f"  {r['label']}: {r['a_text']} -> {r['b_text']} "
                    f"({r['delta_text']}; {r['significance']['verdict']})"
                )
            f = c["findings"]
            print("  resolved:", [(i["code"], i["a_text"]) for i in f["resolved"]])
            print("  new:", [(i["code"], i["b_text"]) for i in f["new"]])
            print("  persisting:", [(i["code"], i["a_text"], i["b_text"]) for i in f["persisting"]])
            print("  traces:", c["traces"].get("reason") or c["traces"]["kind"])
        assert c["config"]["changed"] == [] and c["config"]["comparable"]
        assert c["traces"]["available"], c["traces"].get("reason")
        assert kpis["step_time_ms"]["a"] == pytest.approx(step_a * 1000.0)
        assert kpis["step_time_ms"]["b"] == pytest.approx(step_b * 1000.0)
        # Tokens per step are the same before and after: the rate follows the step time.
        tps = kpis["tokens_per_second_per_gpu"]
        assert tps["b"] / tps["a"] == pytest.approx(step_a / step_b, rel=0.03)
        assert kpis["mfu"]["b"] > kpis["mfu"]["a"] and kpis["mfu"]["significance"]["verdict"] == "better"
    first = build(*(Job.objects.get(external_id=x) for x in DEMO_SEED_PAIRS[0][:2])).comparison
    assert "data_pipeline_stall" in {i["code"] for i in first["findings"]["resolved"]}
    case2 = build(*(Job.objects.get(external_id=x) for x in DEMO_SEED_PAIRS[2][:2])).comparison
    assert "communication_wait" in {i["code"] for i in case2["findings"]["resolved"]}
