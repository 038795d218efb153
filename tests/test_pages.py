"""Pages against real archived series (simulated exporter data in a real Prometheus, pulled by ingestion):
the job page and its figures endpoint, artifact upload, baseline promotion and retirement, the job list,
leaderboard, team, baselines, catalog and readiness pages, with pinned query counts."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from html import unescape

import pytest
from django.urls import reverse

from jobs.evaluation import baselines
from jobs.models import Baseline, Finding, GpuModel, Job, PromotionOverride
from tests.browser import data

pytestmark = [pytest.mark.prometheus]


@pytest.fixture(scope="module")
def sims():
    return data.simulate_all()


@pytest.fixture(scope="module")
def prom(sims, tmp_path_factory):
    with data.prometheus_with(sims, tmp_path_factory.mktemp("pages-prom")) as server:
        yield server


@pytest.fixture
def team(make_team):
    return make_team("llm", "LLM pretraining")


@pytest.fixture
def member(make_user, team):
    return make_user("alice", teams=[team])


@pytest.fixture
def outsider(make_user, make_team):
    return make_user("mallory", teams=[make_team("vision")])


@pytest.fixture
def finished(prom, sims, team):
    """Job 7001: 16 GPUs, 3 h, ended and finalized; its diagnosis plus two findings with short windows."""
    job = data.register(sims["7001"], team, ended=True)
    job = data.ingest(job, prom.url, ended=True)
    assert job.status == Job.Status.FINALIZED and not job.ingest_error
    data.add_findings(job)
    return job


@pytest.fixture
def running_no_sm(prom, sims, team):
    """Job 7002: 4 GPUs, running, polled once; SM_ACTIVE not collected (the exporter default)."""
    job = data.register(sims["7002"], team, ended=False)
    job = data.ingest(job, prom.url, ended=False)
    assert job.status == Job.Status.RUNNING and "sm_active" in job.missing_signals
    return job


def page_data(response) -> dict:
    match = re.search(
        r'<script id="job-data" type="application/json">(.*?)</script>', response.content.decode(), re.S
    )
    assert match, "the page carries its figures in a json_script element"
    return json.loads(match.group(1))


def traces(fig: dict) -> dict[str, dict]:
    return {t["name"]: t for t in fig["data"]}


# ------------------------------------------------------------------------------------------- job page


@pytest.mark.django_db
def test_job_page_shows_kpis_with_units_findings_and_real_series(client, member, finished):
    client.force_login(member)
    response = client.get(reverse("job-detail", args=[finished.external_id]))
    assert response.status_code == 200
    html = response.content.decode()
    # KPI cards say their unit and definition.
    assert "MFU" in html and "tokens/s" in html and "/day" in html and "GPU-h" in html
    assert finished.evaluated.variants["mfu"] in unescape(html)
    assert unescape(finished.evaluated.price_note) in unescape(html)
    # The utilisation contrast comes before the findings and the charts.
    assert html.index("nvidia-smi util") < html.index('id="findings"') < html.index('id="charts"')
    # Findings ranked by $/day (the diagnosis found the planted straggler); those with windows have a
    # keyboard-usable zoom button, the straggler spans the whole job and needs none.
    assert html.index("Clocks throttled") < html.index("Straggler: node-b/7") < html.index("Collectives wait")
    assert html.count('class="zoom secondary"') == 2
    straggler = html[html.index('id="finding-straggler"') :]
    assert "When: the whole job" in straggler[: straggler.index("\n    </li>")]
    # Recommendation text from a rule is escaped, never markup.
    assert "&lt;b&gt;now&lt;/b&gt;" in html and "<b>now</b>" not in html
    # No inline script: json_script is data, and scripts come from our static files.
    for tag in re.findall(r"<script[^>]*>", html):
        assert 'src="/static/' in tag or 'type="application/json"' in tag
    assert "/static/vendor/plotly.min.js" in html and "/static/js/job.js" in html

    figures = page_data(response)
    ts = figures["timeseries"]
    names = traces(ts)
    for name in ("nvidia-smi util", "SM active", "Tensor active", "DRAM active", "SM clock", "MFU"):
        assert name in names, name
    # One shared time axis: every trace on x, hover synchronised across subplots.
    assert {t["xaxis"] for t in ts["data"]} == {"x"}
    assert ts["layout"]["hovermode"] == "x unified" and ts["layout"]["hoversubplots"] == "axis"
    # Values are real: utilisation in %, inside the job window.
    sm = [v for v in names["SM active"]["y"] if v is not None]
    assert 5 < sum(sm) / len(sm) < 100
    x = names["SM active"]["x"]
    assert x[0] >= finished.started_at.timestamp() * 1000 - 3600_000
    assert x[-1] <= finished.ended_at.timestamp() * 1000 + 3600_000
    # Finding windows are shaded across all subplots (not the whole-job straggler: it would tint all).
    shapes = [s for s in ts["layout"]["shapes"] if s.get("name", "").startswith("finding:")]
    assert {s["name"] for s in shapes} == {
        "finding:throttling",
        "finding:communication_wait",
    }
    assert all(s["yref"] == "paper" for s in shapes)
    # Per-GPU heatmap: 16 GPUs, in %.
    heat = figures["heatmap"]["data"][0]
    assert heat["type"] == "heatmap" and len(heat["y"]) == 16 and 0 <= heat["zmin"] < heat["zmax"] <= 100
    assert figures["running"] is False


@pytest.mark.django_db
def test_job_page_names_the_straggler(client, member, finished, sims):
    client.force_login(member)
    html = client.get(reverse("job-detail", args=[finished.external_id])).content.decode()
    planted = sims["7001"].truth["straggler_keys"]
    section = html[html.index('id="gpu-table"') :]
    section = section[: section.index("</table>")]
    row = section[section.index(f"<code>{planted[0]}</code>") :]
    assert "Straggler?" in row[: row.index("</tr>")]
    # Healthy GPUs a point or two under the median are within the band, never flagged (issue 28 item 9).
    assert section.count("Straggler?") == len(planted)


@pytest.mark.django_db
def test_job_page_query_count_is_fixed(client, member, finished, django_assert_num_queries):
    client.force_login(member)
    url = reverse("job-detail", args=[finished.external_id])
    client.get(url)  # warm caches (content types, sessions, the page's body, the compare links)
    # user, the job with its content stamp (jobs.views.job_page_cache), the user's teams for the write check:
    # 3. The session (cached_db sessions) and the runs to compare with (jobs.templatetags.compare_links) come
    # from the cache, the body (findings, artifacts, baseline, alerts, figures) from this process's memory
    # until a row it shows changes; a cold body reads them (7 statements and the figures' 2).
    with django_assert_num_queries(3):
        assert client.get(url).status_code == 200


@pytest.mark.django_db
def test_missing_sm_active_is_missing_not_zero(client, member, running_no_sm):
    client.force_login(member)
    response = client.get(reverse("job-detail", args=[running_no_sm.external_id]))
    html = unescape(response.content.decode())
    figures = page_data(response)
    assert "SM active" not in traces(figures["timeseries"])
    assert "nvidia-smi util" in traces(figures["timeseries"])
    # The heatmap falls back to nvidia-smi util and says so.
    assert "Per GPU: nvidia-smi util" in html
    assert len(figures["heatmap"]["data"][0]["y"]) == 4
    # The contrast says SM active is not collected rather than showing 0 %.
    assert "SM active is not collected" in html
    # Readiness: the field, what its absence hides and the line that enables it.
    ready = html[html.index('id="readiness"') :]
    assert "DCGM_FI_PROF_SM_ACTIVE" in ready and "counters CSV" in ready
    assert figures["running"] is True and figures["refresh_s"] == 60


@pytest.mark.django_db
def test_figures_endpoint_refreshes_and_zooms_with_detail(client, member, finished):
    client.force_login(member)
    url = reverse("job-figures", args=[finished.external_id])
    body = client.get(url, {"points": 200}).json()
    assert body["status"] == "finalized" and body["kpis"]["mfu"].endswith("%")
    for trace in body["timeseries"]["data"]:
        if not trace["name"].endswith(" range"):
            assert len(trace["x"]) <= 200
    start = finished.started_at.timestamp() + 3600
    zoomed = client.get(url, {"points": 800, "start": start, "end": start + 1800}).json()
    sm = traces(zoomed["timeseries"])["SM active"]
    # Only the window (one sample beyond each edge), at full archive resolution.
    assert sm["x"][0] >= (start - 600) * 1000 and sm["x"][-1] <= (start + 1800 + 600) * 1000
    whole = traces(body["timeseries"])["SM active"]
    assert len(sm["x"]) > len([x for x in whole["x"] if start * 1000 <= x <= (start + 1800) * 1000])
    status = client.get(url, {"only": "status"}).json()
    assert "timeseries" not in status and status["artifacts"] == []


@pytest.mark.django_db
def test_pages_require_login(client, finished):
    for url in (
        reverse("job-detail", args=[finished.external_id]),
        reverse("job-figures", args=[finished.external_id]),
    ):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


@pytest.mark.django_db
def test_unknown_job_is_404(client, member):
    client.force_login(member)
    assert client.get(reverse("job-detail", args=["nope"])).status_code == 404
    assert client.get(reverse("job-figures", args=["nope"])).status_code == 404


# -------------------------------------------------------------------------------------------- artifacts


@pytest.fixture
def artifact_store(settings, tmp_path):
    artifacts = pytest.importorskip(
        "jobs.intake.artifacts", reason="jobs/intake/artifacts.py (the artifact store) is absent"
    )
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return artifacts


@pytest.mark.django_db(transaction=True)
def test_member_uploads_a_pyspy_profile_and_sees_its_flame_graph(
    client, member, finished, artifact_store, monkeypatch
):
    from tests.conftest import sample_path

    monkeypatch.setattr(artifact_store, "_enqueue", lambda pk: artifact_store.parse_artifact(pk))
    path = sample_path("pyspy/pyspy_bpe_tokenizer.speedscope.json")
    client.force_login(member)
    with path.open("rb") as fh:
        response = client.post(
            reverse("job-artifact-upload", args=[finished.external_id]), {"file": fh, "rank": "0"}
        )
    assert response.status_code == 302 and response["Location"].endswith("#artifacts")
    page = client.get(response["Location"].split("#")[0])
    html = unescape(page.content.decode())
    assert "Uploaded pyspy_bpe_tokenizer.speedscope.json" in html
    artifact = finished.artifacts.get()
    assert artifact.status == "done", artifact.error
    figures = page_data(page)["artifacts"]
    icicle = figures[f"artifact-{artifact.pk}-icicle"]["data"][0]
    assert icicle["type"] == "icicle" and len(icicle["ids"]) == len(icicle["parents"]) > 10
    assert "Hottest Python frames" in html and "Input pipeline" in html


@pytest.mark.django_db(transaction=True)
def test_kineto_trace_shows_breakdown_bars_and_top_kernels(
    client, member, finished, artifact_store, monkeypatch
):
    from tests.conftest import sample_path

    monkeypatch.setattr(artifact_store, "_enqueue", lambda pk: artifact_store.parse_artifact(pk))
    path = sample_path("kineto/hta_a100_8rank_rank3.json.gz")
    client.force_login(member)
    with path.open("rb") as fh:
        client.post(reverse("job-artifact-upload", args=[finished.external_id]), {"file": fh})
    page = client.get(reverse("job-detail", args=[finished.external_id]))
    html = unescape(page.content.decode())
    artifact = finished.artifacts.get()
    assert artifact.status == "done", artifact.error
    figures = page_data(page)["artifacts"]
    bars = figures[f"artifact-{artifact.pk}-breakdown"]
    assert {t["name"] for t in bars["data"]} >= {"Compute", "Idle"}
    assert "Top kernels by time" in html and "ncclKernel_SendRecv" in html


@pytest.mark.django_db
def test_refused_upload_shows_the_reason(client, member, finished, artifact_store):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.force_login(member)
    svg = SimpleUploadedFile(
        "flame.svg", b'<svg xmlns="http://www.w3.org/2000/svg"><script>x()</script></svg>'
    )
    response = client.post(
        reverse("job-artifact-upload", args=[finished.external_id]), {"file": svg}, follow=True
    )
    html = unescape(response.content.decode())
    assert "Upload of flame.svg refused" in html and "SVG" in html
    assert not finished.artifacts.exists()


@pytest.mark.django_db
def test_only_team_members_upload(client, outsider, finished, artifact_store):
    from django.core.files.uploadedfile import SimpleUploadedFile

    client.force_login(outsider)
    upload = SimpleUploadedFile("x.csv", b"a,b\n1,2\n")
    response = client.post(reverse("job-artifact-upload", args=[finished.external_id]), {"file": upload})
    assert response.status_code == 403
    html = client.get(reverse("job-detail", args=[finished.external_id])).content.decode()
    assert 'enctype="multipart/form-data"' not in html


# -------------------------------------------------------------------------------------------- baselines


@pytest.mark.django_db
def test_promote_creates_and_extends_the_baseline_and_the_page_compares(client, member, finished):
    client.force_login(member)
    url = reverse("job-promote-baseline", args=[finished.external_id])
    # The run has a throttling warning (a health finding): a plain promote, or "anyway" without a reason,
    # is refused, with the message next to the promote form.
    for body in ({}, {"promote_anyway": "1", "reason": "  "}):
        response = client.post(url, body, follow=True)
        html = unescape(response.content.decode())
        assert "Not promoted: this run has hardware or health findings" in html
        assert html.index('id="baseline-messages"') > html.index('id="baseline"')
        assert not Baseline.objects.exists()
    response = client.post(url, {"promote_anyway": "1", "reason": "throttled 30 min of 3 h"}, follow=True)
    html = unescape(response.content.decode())
    assert "Added to the llama-7b baseline" in html and "throttled 30 min of 3 h" in html
    baseline = Baseline.objects.get(fingerprint=finished.config_fingerprint, retired_at__isnull=True)
    assert list(baseline.runs.all()) == [finished]
    assert baseline.stats["mfu"]["median"] == pytest.approx(finished.mfu)
    assert baseline.stats["tokens_per_second_per_gpu"]["median"] == pytest.approx(
        finished.tokens_per_second / 16
    )
    assert baseline.stats["sm_active"]["n"] == 1 and baseline.team == finished.team
    # The override is stored with who, which findings and why.
    override = PromotionOverride.objects.get(baseline=baseline, job=finished)
    assert override.reason == "throttled 30 min of 3 h" and override.user == member
    assert override.finding_codes == ["straggler", "throttling"]  # the fixture's warnings of health kinds
    client.post(url, {"promote_anyway": "1", "reason": "again"})  # idempotent
    assert baseline.runs.count() == 1
    assert list(PromotionOverride.objects.values_list("reason", flat=True)) == ["throttled 30 min of 3 h"]

    html = unescape(client.get(reverse("job-detail", args=[finished.external_id])).content.decode())
    section = html[html.index('id="baseline"') : html.index('id="artifacts"')]
    assert "this job among them" in section and "within" in section
    assert "Promote this run to baseline" not in section


@pytest.mark.django_db
def test_running_jobs_cannot_be_promoted_and_outsiders_cannot_promote(
    client, member, outsider, running_no_sm
):
    client.force_login(member)
    response = client.post(reverse("job-promote-baseline", args=[running_no_sm.external_id]), follow=True)
    assert "Not promoted: only finished jobs" in unescape(response.content.decode())
    client.force_login(outsider)
    assert client.post(reverse("job-promote-baseline", args=[running_no_sm.external_id])).status_code == 403
    assert not Baseline.objects.exists()


@pytest.mark.django_db
def test_compare_flags_a_regression_with_deviation_and_robust_z(finished, member):
    # The fixture's run has throttling and straggler warnings: promoted with a reason (the page's "anyway").
    baseline = baselines.promote(finished, member, override_reason="throttled 30 min of 3 h").baseline
    other = Job.objects.get(pk=finished.pk)
    other.mfu = finished.mfu * 0.7
    comparison = baselines.compare_with(other, baseline)
    mfu = next(r for r in comparison.rows if r.metric.key == "mfu")
    assert mfu.verdict == "regression"
    assert mfu.check.deviation_pct == pytest.approx(-30.0)
    assert mfu.check.robust_z is None  # one run: no spread, the 5 % floor decides
    assert comparison.regressions == [mfu]


@pytest.mark.django_db
def test_baselines_page_retires_for_team_members_only(client, member, outsider, finished):
    # The fixture's run has throttling and straggler warnings: promoted with a reason (the page's "anyway").
    baseline = baselines.promote(finished, member, override_reason="throttled 30 min of 3 h").baseline
    client.force_login(outsider)
    html = client.get(reverse("baseline-list")).content.decode()
    assert "llama-7b" in html and ">Retire</button>" not in html
    assert client.post(reverse("baseline-retire", args=[baseline.pk])).status_code == 403
    client.force_login(member)
    assert ">Retire</button>" in client.get(reverse("baseline-list")).content.decode()
    # Retiring asks for a confirmation: without the ticked box nothing changes.
    response = client.post(reverse("baseline-retire", args=[baseline.pk]), follow=True)
    assert "was not retired" in unescape(response.content.decode())
    baseline.refresh_from_db()
    assert baseline.retired_at is None
    response = client.post(reverse("baseline-retire", args=[baseline.pk]), {"confirm": "yes"}, follow=True)
    assert "Retired the llama-7b baseline" in unescape(response.content.decode())
    baseline.refresh_from_db()
    assert baseline.retired_at is not None
    assert baselines.compare(finished) is None


# ------------------------------------------------------------------------------------------ list pages


@pytest.fixture
def many_jobs(team, make_team):
    """30 jobs over two teams in the simulation's week and the week before, with MFU and waste, on H100s
    (the period totals price them from the H100 on-demand book; their waste is their share of that)."""
    vision = make_team("vision")
    h100 = GpuModel.objects.get(name="H100 SXM")
    jobs = []
    for i in range(30):
        start = data.START - timedelta(days=9) + timedelta(hours=11 * i)
        jobs.append(
            Job.objects.create(
                external_id=f"j{i:03d}", name=f"job {i}", team=team if i % 2 else vision,
                model_name="llama-7b", gpu_count=8, started_at=start, ended_at=start + timedelta(hours=10),
                gpu_model=h100, status=Job.Status.FINALIZED, mfu=0.2 + 0.01 * i, sm_active_mean=0.5,
                cost_per_day_usd=1000 + i, waste_per_day_usd=(30 - i) * 10.0, gpu_hours=80,
            )
        )  # fmt: skip
    Finding.objects.create(
        job=jobs[0],
        code="idle_gpus",
        severity="critical",
        confidence=0.9,
        title="Idle GPUs",
        evidence=[],
        recommendation="Release them.",
        waste_per_day_usd=300,
    )
    return jobs


@pytest.mark.django_db
def test_job_list_sorts_by_mfu_and_waste_with_fixed_queries(
    client, member, many_jobs, django_assert_num_queries
):
    client.force_login(member)
    client.get(reverse("job-list"))
    # user, count, page, teams, GPU models, model names, the page's open alert counts (the session comes
    # from the cache: cached_db sessions)
    with django_assert_num_queries(7):
        html = client.get(reverse("job-list"), {"sort": "-mfu"}).content.decode()
    ids = re.findall(r'<div class="sub">(j\d{3})', html)
    assert ids[:3] == ["j029", "j028", "j027"]
    html = client.get(reverse("job-list"), {"sort": "-waste", "team": "llm"}).content.decode()
    ids = re.findall(r'<div class="sub">(j\d{3})', html)
    assert ids[0] == "j001" and all(int(i[1:]) % 2 for i in ids)
    assert 'aria-sort="descending"' in html
    bad = client.get(reverse("job-list"), {"since": "yesterday"}).content.decode()
    assert "is not a date" in bad


@pytest.mark.django_db
def test_leaderboard_weekly_and_monthly_with_trend_and_worst_jobs(
    client, member, many_jobs, django_assert_num_queries
):
    client.force_login(member)
    week = "2025-W52"  # the week before the simulation's start (2026-01-01 is in 2026-W01)
    client.get(reverse("leaderboard"), {"week": week})
    # user, all periods' team numbers in one aggregation, worst jobs, their main findings (the session
    # comes from the cache: cached_db sessions)
    with django_assert_num_queries(4):
        response = client.get(reverse("leaderboard"), {"week": week, "sort": "waste"})
    html = unescape(response.content.decode())
    rows = re.findall(r'<tr data-team="([\w-]+)">', html)
    assert set(rows) == {"llm", "vision"}
    table = response.context["table"]
    assert [r.row.waste_usd for r in table] == sorted((r.row.waste_usd for r in table), reverse=True)
    assert "<polyline" in html and "Weighted MFU by week" in html
    assert "pp" in html  # change vs the previous week
    assert "Idle GPUs" in html  # worst jobs name their main finding
    monthly = client.get(reverse("leaderboard"), {"month": "2025-12", "sort": "team"})
    assert monthly.status_code == 200 and "2025-12" in monthly.content.decode()
    assert [r.row.team_slug for r in monthly.context["table"]] == ["llm", "vision"]


@pytest.mark.django_db
def test_team_catalog_and_readiness_pages(client, member, team, running_no_sm, finished):
    client.force_login(member)
    html = unescape(client.get(reverse("team-detail", args=[team.slug])).content.decode())
    assert "LLM pretraining" in html and "pretrain-7001" in html and "Weekly email for" in html
    catalog = unescape(client.get(reverse("gpu-catalog")).content.decode())
    assert "H100 SXM" in catalog and "USD per GPU-hour" in catalog and "989.5" in catalog
    readiness = unescape(client.get(reverse("cluster-readiness")).content.decode())
    row = readiness[readiness.index("DCGM_FI_PROF_SM_ACTIVE") :]
    assert "pretrain-7002" in row[: row.index("</tr>")]
    assert "(1 running)" in readiness and "in the last 7 days" in readiness


@pytest.mark.django_db
def test_one_pass_period_numbers_equal_the_leaderboard_module(many_jobs, running_no_sm):
    from datetime import date

    from jobs.outputs.leaderboard import iso_week, last_weeks, month, period_rows, team_rows

    now = data.START + timedelta(hours=2)
    periods = [*last_weeks(iso_week(now.date())), month(date(2025, 12, 1)), month(now.date())]
    got = period_rows(periods, now=now)
    compared = 0
    for period, rows in zip(periods, got, strict=True):
        expected = {r.team_id: r for r in team_rows(period, now=now)}
        assert rows.keys() == expected.keys(), period.label
        for team_id, want in expected.items():
            have = rows[team_id]
            assert have.jobs == want.jobs
            for field in ("gpu_hours", "cost_usd", "waste_usd", "weighted_mfu"):
                assert getattr(have, field) == pytest.approx(getattr(want, field), rel=1e-9), field
            compared += 1
    assert compared >= 6
