"""Artifacts that carry no GPU, time, rank or host join the diagnosis only as "unverified"
(jobs.diagnosis.belonging), and the run check matches what such files do carry (jobs.profiling.run_check).
No database."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.diagnosis import diagnose
from jobs.diagnosis import thresholds as T
from jobs.diagnosis.artifacts import capture_of
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput, Severity
from jobs.diagnosis.belonging import diagnose_checked
from jobs.profiling import monitoring, pyspy
from jobs.profiling.kineto import parse_kineto
from jobs.profiling.run_check import JobFacts, check_run, short_host
from jobs.profiling.trace_analysis import analyze_trace
from tests.conftest import sample_path

DATA = Path(__file__).parent / "data"
JOB = JobFacts(
    gpu_model="H100 SXM", gpu_count=8, start_unix=1.7e9, end_unix=1.7e9 + 3600, hosts=("gpu-node7",)
)


def check(capture: object, job: JobFacts = JOB) -> str:
    return check_run(capture, job, rank=None, now_unix=1.7e9 + 7200, canonical_gpu=lambda n: None).status  # type: ignore[arg-type]


def unrelated_pyspy() -> ArtifactAnalysis:
    """The real py-spy profile of a BPE tokenizer's training (a CPU program: no GPU, no time, no rank):
    37 % of its samples in tokenization, which data_pipeline_stall reads as input-pipeline evidence."""
    path = sample_path("pyspy/pyspy_bpe_tokenizer.speedscope.json")
    return ArtifactAnalysis(kind="pyspy_speedscope", analysis=pyspy.analyze_pyspy(path, filename=path.name),
                            name=path.name)  # fmt: skip


def tb_trace() -> ArtifactAnalysis:
    """The TensorBoard plugin's real V100 trace: its single-process DataLoader idles the GPU 5.4 % of the
    step -> data_pipeline_stall (info) from the trace alone."""
    path = sample_path("kineto/tbplugin_gpu_metrics_input.json")
    return ArtifactAnalysis(kind="kineto", analysis=analyze_trace(parse_kineto(path)), name=path.name)


def test_an_unrelated_pyspy_profile_no_longer_raises_a_findings_confidence() -> None:
    """Issue 24: a py-spy profile of an unrelated CPU program raised a job's confidence (70 % -> 85 %)."""
    trace, spy = tb_trace(), unrelated_pyspy()
    alone = {f.code: f for f in diagnose(DiagnosisInput(signals=None, gpu_count=8, artifacts=[trace]))}
    inp = DiagnosisInput(signals=None, gpu_count=8, artifacts=[trace, spy])
    raised = {f.code: f for f in diagnose(inp)}["data_pipeline_stall"]
    # What the rule does when it is told the profile belongs (a user confirmed it): +0.15.
    assert raised.confidence == pytest.approx(alone["data_pipeline_stall"].confidence + 0.15)
    checked = {f.code: f for f in diagnose_checked(inp, [spy])}
    f = checked["data_pipeline_stall"]
    assert f.confidence == alone["data_pipeline_stall"].confidence
    assert f.severity == alone["data_pipeline_stall"].severity
    assert f.waste_per_day_usd == alone["data_pipeline_stall"].waste_per_day_usd
    # What the profile says stays visible, labelled.
    labels = [e.label for e in f.evidence]
    assert "unverified" in labels
    assert f"unverified: {spy.name}: Python samples in the input pipeline" in labels
    assert f"unverified: {spy.name}" in f.sources
    # Every other finding is the trace's own.
    assert set(checked) == set(alone)


def test_a_finding_only_an_unverified_profile_gives_is_listed_at_the_lowest_confidence() -> None:
    spy = unrelated_pyspy()
    inp = DiagnosisInput(signals=None, gpu_count=8, artifacts=[spy], cost_per_day_usd=1000.0,
                         waste_per_day_usd=400.0)  # fmt: skip
    found = {f.code: f for f in diagnose_checked(inp, [spy])}
    # The $400/day stay unexplained: an unchecked file explains none of them.
    assert set(found) == {"data_pipeline_stall", "unexplained_waste"}
    assert found["unexplained_waste"].waste_per_day_usd == 400.0
    f = found["data_pipeline_stall"]
    assert f.title.startswith("Unverified: ")
    assert f.confidence == T.MIN_CONFIDENCE and f.severity is Severity.INFO
    assert f.waste_per_day_usd is None and f.waste_share is None  # no dollars from an unchecked file
    assert f.evidence[0].label == "unverified"


def test_without_unverified_artifacts_the_diagnosis_is_unchanged() -> None:
    trace = tb_trace()
    inp = DiagnosisInput(signals=None, gpu_count=8, artifacts=[trace])
    assert [f.as_dict() for f in diagnose_checked(inp, [])] == [f.as_dict() for f in diagnose(inp)]


def test_pyspy_names_its_processes_but_nothing_on_the_job_can_check_them() -> None:
    # py-spy --subprocesses writes process PID:"command" frames (tests/unit/data, py-spy 0.3 format).
    capture = pyspy.analyze_pyspy(DATA / "pyspy_train_subprocesses.txt")["capture"]
    assert capture["pids"] == [31337, 31402]
    assert capture["commands"] == ["python train.py --config configs/gpt2_small.yaml"]
    assert capture["start_unix"] is None and capture["gpu_names"] == [] and capture["ranks"] == []
    assert check(capture) == "unverifiable"
    # Without --subprocesses there are no process frames and no keys.
    assert "pids" not in pyspy.analyze_pyspy(DATA / "pyspy_train_plain.txt")["capture"]


def test_a_dstat_log_is_matched_by_its_host_and_time_range() -> None:
    analysis = monitoring.analyze_dstat(DATA / "dstat_0.7.3.csv")
    capture = capture_of(analysis)
    assert capture is not None and capture["hosts"] == [analysis["host"]]
    start, end = capture["start_unix"], capture["end_unix"]
    host = analysis["host"]
    window = JobFacts(gpu_model=None, gpu_count=8, start_unix=start or 0.0, end_unix=end, hosts=(host,))
    assert check(capture, window) == "matches"
    elsewhere = JobFacts(gpu_model=None, gpu_count=8, start_unix=start or 0.0, end_unix=end, hosts=("other",))
    assert check(capture, elsewhere) == "mismatch"
    # A job without a host mapping: only the time range can be compared.
    no_hosts = JobFacts(gpu_model=None, gpu_count=8, start_unix=start or 0.0, end_unix=end)
    assert check(capture, no_hosts) == ("matches" if start is not None else "unverifiable")


def test_hosts_are_compared_by_short_name() -> None:
    assert short_host("GPU-Node7.cluster.local") == "gpu-node7"
    assert short_host("10.0.0.7") == "10.0.0.7"
    assert check({"hosts": ["gpu-node7.example.org"]}) == "matches"
    assert check({"hosts": ["gpu-node8"]}) == "mismatch"
    assert check({"hosts": [""]}) == "unverifiable"


def test_a_rank_typed_at_upload_does_not_verify_a_file_that_states_nothing() -> None:
    # py-spy uploaded as "rank 0": the claim fits the job, but nothing in the file shows it belongs.
    capture = pyspy.analyze_pyspy(DATA / "pyspy_train_plain.txt")["capture"]
    result = check_run(capture, JOB, rank=0, now_unix=1.7e9 + 7200, canonical_gpu=lambda n: None)
    assert (result.status, result.checked) == ("unverifiable", ["rank"])
    # The claim can still show a mismatch ...
    assert check_run(capture, JOB, rank=9, now_unix=1.7e9, canonical_gpu=lambda n: None).status == "mismatch"
    # ... and a rank the file states itself is evidence.
    assert check({"ranks": [3]}) == "matches"
