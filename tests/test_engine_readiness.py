"""Issue 25 follow-up: the cluster readiness page's line for the serving engines' FLOP counters (vLLM /
SGLang `--enable-mfu-metrics`): seen in Prometheus or not, for which engine and namespace (how many pods),
which series join no job (no namespace/pod label), and how to enable them when absent."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jobs.metrics import engine_signals as E
from jobs.runtime.health import engine_source
from jobs.simulate import DEFAULT_START, backfill
from jobs.simulate import vllm as V
from tests.prom_server import PrometheusProcess, prometheus_binary

T0 = DEFAULT_START
LOOKBACK = 600.0


def test_the_line_says_not_checked_absent_with_how_to_enable_or_seen_per_namespace() -> None:
    unchecked = E.source_readiness(None, LOOKBACK, "ConnectionError: refused")
    assert unchecked["series_seen"] is None
    assert unchecked["reason"] == "not checked: Prometheus did not answer (ConnectionError: refused)"
    absent = E.source_readiness([], LOOKBACK)
    assert absent["series_seen"] is False and absent["groups"] == []
    assert absent["reason"].startswith(
        "no vllm:estimated_flops_per_gpu_total or sglang:estimated_flops_per_gpu_total series in the "
        "last 10 min"
    )
    assert "--enable-mfu-metrics" in absent["reason"] and "ServiceMonitor" in absent["reason"]
    rows = [
        ({"engine": "vllm", "namespace": "llm", "pod": "a"}, 1.0),
        ({"engine": "vllm", "namespace": "llm", "pod": "b"}, 2.0),  # two engines in one pod: one pod
        ({"engine": "vllm", "exported_namespace": "chat", "exported_pod": "c"}, 1.0),  # stored as exported_*
        ({"engine": "sglang", "namespace": "llm", "pod": "d"}, 1.0),
        ({"engine": "vllm"}, 3.0),  # scraped by a static config: no namespace/pod, joins no job
    ]
    seen = E.source_readiness(rows, LOOKBACK)
    assert seen["series_seen"] is True and seen["unjoinable"] == 3
    assert seen["groups"] == [
        "sglang in namespace llm: 1 pod",
        "vllm in namespace chat: 1 pod",
        "vllm in namespace llm: 2 pods",
    ]
    assert seen["reason"].startswith("seen in the last 10 min for sglang in namespace llm: 1 pod; vllm in")
    assert "3 vllm series carry no namespace/pod label and join no job" in seen["reason"]
    only_unjoinable = E.source_readiness([({"engine": "sglang"}, 2.0)], LOOKBACK)
    assert only_unjoinable["series_seen"] is True and only_unjoinable["groups"] == []
    assert only_unjoinable["reason"].startswith("2 sglang series carry no namespace/pod label")


@pytest.fixture(scope="module")
def engine_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusProcess]:
    """Two vLLM servers in namespace llm (a ServiceMonitor's labels) and one SGLang server scraped without
    pod labels, 10 minutes of 15 s scrapes from T0."""
    if prometheus_binary() is None or shutil.which("promtool") is None:
        pytest.skip("prometheus and promtool binaries are not installed (Debian/Ubuntu package: prometheus)")
    work: Path = tmp_path_factory.mktemp("engine-ready")
    ts = T0 + 15.0 * np.arange(41)
    served = V.simulate_engine(["vllm-a-0", "vllm-b-0"], ts, 1e14, namespace="llm")
    sglang = V.simulate_engine(["sg-0"], ts, 2e14, engine="sglang")
    for rows in sglang.series.values():
        for labels, _ in rows:
            labels.pop("pod"), labels.pop("namespace")  # a static scrape config: no Kubernetes labels
    body = "".join(V.openmetrics_lines(served)) + "".join(V.openmetrics_lines(sglang)) + "# EOF\n"
    (work / "data.om").write_text(body)
    backfill(work / "data.om", work / "tsdb")
    with PrometheusProcess(work / "tsdb") as prom:
        yield prom


@pytest.mark.prometheus
def test_the_check_counts_the_engines_pods_per_namespace_in_prometheus(
    engine_prom: PrometheusProcess, settings: Any
) -> None:
    settings.PROMETHEUS_URL = engine_prom.url
    line = engine_source(now=T0 + 600.0)
    assert line["series_seen"] is True, line
    assert line["groups"] == ["vllm in namespace llm: 2 pods"] and line["unjoinable"] == 1
    assert "1 sglang series carry no namespace/pod label" in line["reason"]
    # Past the look-back nothing is seen, and the line says how to enable the counters.
    later = engine_source(now=T0 + 600.0 + 2 * LOOKBACK)
    assert later["series_seen"] is False and "--enable-mfu-metrics" in later["reason"]


def test_the_line_names_the_serving_jobs_that_read_no_engine_flops() -> None:
    seen = E.source_readiness([({"engine": "vllm", "namespace": "llm", "pod": "a"}, 1.0)], LOOKBACK)
    assert E.with_serving_jobs(seen, [], [])["reason"] == seen["reason"]  # no serving job: nothing to add
    every = E.with_serving_jobs(seen, ["s1"], [])
    assert every["reason"].endswith("; all 1 serving jobs polled read their engine's FLOPs")
    ids = [f"s{i}" for i in range(8)]
    some = E.with_serving_jobs(E.source_readiness([], LOOKBACK), ids, ids[1:])
    assert some["serving_jobs"] == 8 and some["serving_without"] == ids[1:]
    assert some["reason"].endswith(
        "; 7 of 8 serving jobs polled read no engine FLOPs (s1, s2, s3, s4, s5 and 2 more)"
    )


@pytest.mark.django_db
def test_the_readiness_page_lists_the_engines_line(admin_client: Any, settings: Any, make_team: Any) -> None:
    from django.utils import timezone

    from jobs.models import Job

    settings.PROMETHEUS_URL = "http://127.0.0.1:9"  # nothing listens: the line says it was not checked
    settings.HEALTHZ_PROMETHEUS_TIMEOUT_S = 1.0
    team = make_team("serving")
    now = timezone.now()
    for external_id, kind, missing in (
        ("serve-a", Job.Kind.INFERENCE, []),
        ("serve-b", Job.Kind.INFERENCE, ["engine_flops", "engine_read_bytes"]),
        ("train-c", Job.Kind.TRAINING, ["engine_flops"]),  # not a server: not counted
    ):
        Job.objects.create(external_id=external_id, team=team, name=external_id, model_name="m",
                           gpu_model_name="NVIDIA H100 80GB HBM3", gpu_count=1, started_at=now,
                           status=Job.Status.RUNNING, kind=kind, missing_signals=missing,
                           last_polled_at=now)  # fmt: skip
    page = admin_client.get("/readiness/").content.decode()
    table = page[page.index('id="sources-table"') :]
    assert "<code>serving engines (vLLM / SGLang FLOP counters)</code>" in table
    assert "read for serving jobs (kind inference)" in table
    assert "not checked: Prometheus did not answer" in table
    assert "1 of 2 serving jobs polled read no engine FLOPs (serve-b)" in table
