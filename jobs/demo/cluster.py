"""Demo data: teams, users and a simulated cluster whose metrics go into a real Prometheus.

Every demo job is a simulator scenario (jobs.simulate) backfilled into Prometheus with promtool, so its
page, MFU, cost and findings come out of the same pipeline as a real job's. Running jobs keep
receiving data from a simulated dcgm-exporter endpoint that the demo's Prometheus scrapes.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse

from jobs.artifacts import parse_artifact, store_upload
from jobs.evaluation.baselines import SYSTEM, promote
from jobs.evaluation.flops import utilisation
from jobs.findings import run_diagnosis
from jobs.metrics.ingest import prometheus_client
from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.models import Finding, Job, Membership, Team
from jobs.ownership import Claimant
from jobs.pipeline.poll import ingest_once
from jobs.registry import register_job
from jobs.simulate import (
    SCENARIOS,
    TOKENS_METRIC,
    SimResult,
    SimSpec,
    backfill,
    exporter_text,
    registration_body,
    simulate,
    write_openmetrics,
)
from jobs.simulate.exporter import Exporter
from jobs.simulate.seeds import SEED_CASES

log = logging.getLogger(__name__)

DEMO_PASSWORD = "demo-password"
TEAMS = (("llm-pretrain", "LLM pretraining"), ("vision", "Vision"), ("speech", "Speech"))
MEMBERS = (("alice", "llm-pretrain"), ("bob", "vision"), ("carol", "speech"))
LIVE_SPECS_FILE = "demo-live-jobs.json"
HOST_SYNC_JOB = "demo-4850"
IDLE_LIVE_JOB = "demo-4902"  # running, goes idle after 90 minutes: shows an alert
_MODELS = (("llama-7b", 6.7e9), ("vit-h-632m", 0.63e9), ("whisper-large-1.5b", 1.55e9))


@dataclass(frozen=True)
class DemoJob:
    """One demo job: the simulator spec plus what the scheduler would register."""

    spec: SimSpec
    team: str
    name: str
    model: str
    ended: bool
    kind: str = "training"
    #: The seed runs' batch: their throughput is tokens per step / step time (`step_throughput`).
    batch: SeedBatch | None = None


@dataclass(frozen=True)
class SeedBatch:
    """A seed case's global batch (sequences of `seq_len` tokens per optimizer step, over all ranks): the
    same in every run of the case, since a fix changes the step time, not the batch."""

    sequences: int
    seq_len: int

    @property
    def tokens_per_step(self) -> int:
        """Tokens one training step consumes over all ranks."""
        return self.sequences * self.seq_len


#: The seed cases' batches. Case 1 (8 A100s, 2048-token sequences): 8 sequences a step (one per rank), so
#: run 1's 2 s step is 8,192 tokens/s, MFU 14 % with the PaLM FLOPs of the 6.7e9 model (the simulator's
#: tensor activity gives 15 %); case 2 (32 H100s): 96 sequences (3 per rank), MFU 34 % at 1.5 s a step
#: (tensor activity: 32 %). The seed gives utilisation and step times, not batches: these are chosen so
#: the MFU agrees with the recorded tensor activity within the simulator's hardware cross-check.
SEED_BATCH = {"seed1": SeedBatch(8, 2048), "seed2": SeedBatch(96, 2048)}


def _spec(scenario: str, job_id: str, hosts: tuple[str, ...], gpus: int, start: float, hours: float,
          step: float, seed: int, params: float) -> SimSpec:  # fmt: skip
    return SimSpec(scenario=scenario, gpus=gpus, hosts=hosts, job_id=job_id, start=start,
                   duration_s=hours * 3600, step_s=step, seed=seed, model_params=params)  # fmt: skip


def plan(now: datetime) -> list[DemoJob]:
    """The demo cluster relative to `now`: a showcase job per scenario, running jobs, six weeks of history."""
    jobs: list[DemoJob] = []
    node = 1
    t_now = now.timestamp() // 60 * 60

    def hosts(n_gpus: int) -> tuple[str, ...]:
        nonlocal node
        count = max(1, n_gpus // 8)
        names = tuple(f"gpu-node-{node + i:03d}" for i in range(count))
        node += count
        return names

    scenarios = [s for s in SCENARIOS if s != "healthy"]
    for i, scenario in enumerate(scenarios):
        team, _ = TEAMS[i % len(TEAMS)]
        model, params = _MODELS[i % len(_MODELS)]
        gpus = 16 if scenario in ("straggler", "communication_wait", "idle_gpus") else 8
        start = t_now - (5 + i % 3) * 3600
        spec = _spec(scenario, f"demo-{4800 + i}", hosts(gpus), gpus, start, 2.0, 60.0, 100 + i, params)
        jobs.append(DemoJob(spec, team, f"{model}-{scenario.replace('_', '-')}", model, ended=True))
    # host_sync shows only in a trace: this job gets a synthetic profiler trace with blocking syncs.
    start = t_now - 4 * 3600
    spec = _spec("false_saturation", HOST_SYNC_JOB, hosts(8), 8, start, 2.0, 60.0, 150, 6.7e9)
    jobs.append(DemoJob(spec, "llm-pretrain", "llama-7b-host-sync", "llama-7b", ended=True))
    # Two running jobs (healthy and false saturation): the live exporter keeps feeding them.
    for j, scenario in enumerate(("healthy", "false_saturation")):
        team, _ = TEAMS[j]
        model, params = _MODELS[j]
        start = t_now - 2 * 3600
        spec = _spec(scenario, f"demo-{4900 + j}", hosts(8), 8, start, 24 * 7, 30.0, 200 + j, params)
        jobs.append(DemoJob(spec, team, f"{model}-live-{scenario.replace('_', '-')}", model, ended=False))
    # The seed articles' case studies (jobs.simulate.seeds), recorded as dcgm-exporter really records them
    # (15 s scrapes, 30 s collect interval, NVML's 1 s window, ~1 % failed scrapes): case 1 as three runs
    # of the same LoRA fine-tune (33 % -> 68 % after the input fix -> 85 % after fusing small kernels)
    # and case 2, 32 H100s in lock-step waiting in an exposed collective every step, then with the
    # gradients all-reduced in buckets beside the backward pass. Each run gets a trace (SEED_TRACES) and a
    # throughput of its batch's tokens per step over its step time (step_throughput).
    for k, (name, case) in enumerate(SEED_CASES.items()):
        start = t_now - (10 - 2 * k) * 3600
        batch = SEED_BATCH[name.split("-")[0]]
        spec = SimSpec(scenario="healthy", gpus=case.gpus, gpu_model=case.gpu_model, hosts=hosts(case.gpus),
                       job_id=f"demo-{name}", start=start, duration_s=1.5 * 3600, seed=400 + k,
                       model_params=case.model_params, workload=case.workload, seq_len=batch.seq_len,
                       exporter=Exporter(scrape_s=15.0, collect_s=30.0))  # fmt: skip
        kind = "fine_tuning" if name.startswith("seed1") else "training"
        model = "llama-7b-lora" if name.startswith("seed1") else "llm-13b"
        jobs.append(DemoJob(spec, "llm-pretrain", f"{name}: {case.title}", model, True, kind, batch))
    # History: two jobs per team per week for six weeks, mostly healthy, some wasteful.
    history = (
        "healthy",
        "healthy",
        "false_saturation",
        "data_pipeline_stall",
        "healthy",
        "tensor_cores_idle",
    )
    for week in range(1, 7):
        for t, (team, _) in enumerate(TEAMS):
            for k in range(2):
                scenario = history[(week + t + k) % len(history)]
                model, params = _MODELS[t]
                start = t_now - week * 7 * 86400 + (t * 2 + k) * 9 * 3600
                job_id = f"demo-h{week}{t}{k}"
                seed = 300 + week * 10 + t * 2 + k
                spec = _spec(scenario, job_id, hosts(4), 4, start, 12.0, 600.0, seed, params)
                jobs.append(DemoJob(spec, team, f"{model}-w{week}-{k}", model, ended=True))
    # A running job that worked for 90 minutes, then left a quarter of its GPUs idle (issue #17): the
    # gpus_idle alert opens on the first poll once they have been idle for ALERT_IDLE_MINUTES.
    spec = _spec("idle_gpus", IDLE_LIVE_JOB, hosts(8), 8, t_now - 2 * 3600, 24 * 7, 30.0, 210, 6.7e9)
    spec = replace(spec, params={"idle_from": 1.5 / (24 * 7)})
    jobs.append(DemoJob(spec, "llm-pretrain", "llama-7b-live-goes-idle", "llama-7b", ended=False))
    return jobs


@transaction.atomic
def ensure_people() -> dict[str, Team]:
    """Teams, the staff user `demo` (member of every team) and one member per team."""
    user_model = get_user_model()
    teams = {slug: Team.objects.get_or_create(slug=slug, defaults={"name": name})[0] for slug, name in TEAMS}
    demo, created = user_model.objects.get_or_create(
        username="demo", defaults={"email": "demo@example.com", "is_staff": True, "is_superuser": True}
    )
    if created:
        demo.set_password(DEMO_PASSWORD)
        demo.save()
    for team in teams.values():
        Membership.objects.get_or_create(team=team, user=demo, defaults={"role": Membership.Role.LEAD})
    for username, slug in MEMBERS:
        user, created = user_model.objects.get_or_create(
            username=username, defaults={"email": f"{username}@example.com"}
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        Membership.objects.get_or_create(team=teams[slug], user=user)
    return teams


def register(demo: DemoJob, result: SimResult, teams: dict[str, Team], now: datetime) -> Job:
    """Register a demo job as a scheduler would (explicit GPUs, a throughput PromQL expression)."""
    spec = demo.spec
    body = registration_body(
        result,
        team=teams[demo.team],
        name=demo.name,
        model=demo.model,
        ended=demo.ended,
        # rate() needs two samples in its window: coarse history (600 s samples) gets a wider one.
        rate_window_s=max(300, int(3 * spec.step_s)),
        owner=next(u for u, t in MEMBERS if t == demo.team),
        parallelism={"tp": 1, "pp": 1, "dp": spec.gpus, "ep": 1},
        kind=demo.kind,
        **(
            {
                "micro_batch": demo.batch.sequences // spec.gpus,
                "global_batch": demo.batch.sequences,
                "tokens_per_step": demo.batch.tokens_per_step,
            }
            if demo.batch is not None
            else {}
        ),
    )
    if body["ended_at"] is not None and body["ended_at"] >= now:
        body["ended_at"] = None  # still running as far as the demo's clock goes
    return register_job(body, Claimant.platform(Job.Provenance.DEMO, "demo loader")).job


def step_throughput(result: SimResult, batch: SeedBatch) -> SimResult:
    """The run's throughput as its training loop would report it: the batch's tokens once per step of the
    workload (tokens/s = tokens per step / step time), with MFU from that rate (PaLM FLOPs per token over
    the GPUs' dense BF16 peak). The simulator's default derives tokens from tensor activity instead, which
    would give the seed's case 1 a 27 % rise where the step time halves (issue 28 item 5)."""
    workload = result.spec.workload
    if workload is None:
        raise ValueError(f"{result.spec.job_id}: not a step-level workload, it has no step time")
    tp = result.throughput
    rate = batch.tokens_per_step / workload.step_s
    tps = np.full(len(result.timestamps), rate)
    mfu = utilisation(tp.flops_per_token, rate, len(result.gpus) * tp.peak_flops_per_gpu)
    # The counter a training loop exports: cumulative tokens at each sample (scrape interval = spec.step_s).
    total = np.cumsum(tps * result.spec.step_s)
    return replace(result, throughput=replace(tp, tokens_per_s=tps, tokens_total=total, mfu=mfu))


def simulate_job(demo: DemoJob, now: datetime) -> SimResult:
    """A demo job's exporter data and throughput up to `now` (a running job's samples stop there)."""
    result = simulate(demo.spec)
    if demo.batch is not None:
        result = step_throughput(result, demo.batch)
    return truncate(result, now.timestamp())


BACKFILL_TIMEOUT_S = 1800.0
#: Progress lines: one per this many jobs backfilled (promtool is most of `load`'s minutes).
PROGRESS_EVERY_JOBS = 10

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def backfill_results(results: list[SimResult], tsdb_dir: Path, progress: Progress = _quiet) -> None:
    """Write the jobs' series as TSDB blocks into `tsdb_dir` with promtool, all or nothing."""
    tsdb_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # Blocks are written to a staging directory and moved into tsdb_dir only once every job's
        # backfill succeeded: an interrupted run must not leave blocks behind, since a rerun simulates
        # the same series at a slightly different `now` and the two would interleave (counter resets
        # everywhere: rate() and so MFU many times too high).
        staging = Path(tmp) / "blocks"
        # One OpenMetrics file per job: promtool (2.42 has no --max-block-duration) parses its whole
        # input once per 2 h block it writes, so one file of six weeks (550 MB) costs 504 passes over
        # 550 MB; per job it is each job's own blocks over its own samples. Overlapping blocks of
        # jobs that ran at the same time are merged by Prometheus.
        for i, result in enumerate(results):
            path = Path(tmp) / f"demo-{i}.om"
            write_openmetrics([result], path)
            # The limit only stops a hung promtool (a busy machine makes it slow, not stuck).
            backfill(path, staging, timeout_s=BACKFILL_TIMEOUT_S)
            path.unlink()
            done = i + 1
            if done % PROGRESS_EVERY_JOBS == 0 or done == len(results):
                progress(f"backfill: {done}/{len(results)} jobs written")
        for block in staging.iterdir():
            shutil.move(block, tsdb_dir / block.name)


def load(
    tsdb_dir: Path, state_dir: Path, now: datetime | None = None, progress: Progress = _quiet
) -> dict[str, Any]:
    """Create people and jobs, backfill their metrics into `tsdb_dir`; idempotent (skips loaded jobs).

    The running jobs are simulated and backfilled last, up to the moment just before their own backfill
    (not the start of `load`): the minutes the history takes to backfill are not a hole in their data.
    """
    began = time.monotonic()
    now = now or datetime.now(UTC)
    teams = ensure_people()
    planned = plan(now)
    known = set(
        Job.objects.filter(external_id__in=[d.spec.job_id for d in planned]).values_list(
            "external_id", flat=True
        )
    )
    new = [d for d in planned if d.spec.job_id not in known]
    ended = [d for d in new if d.ended]
    running = [d for d in new if not d.ended]
    if new:
        progress(f"simulate: {len(ended)} ended jobs")
        results = [simulate_job(d, now) for d in ended]
        progress(f"backfill: {len(ended)} ended jobs into {tsdb_dir}")
        backfill_results(results, tsdb_dir, progress)
        # `now` moved on while the history was backfilled (minutes on a busy machine).
        live_until = now + timedelta(seconds=time.monotonic() - began)
        progress(f"simulate and backfill: {len(running)} running jobs up to {live_until:%H:%M:%S} UTC")
        live_results = [simulate_job(d, live_until) for d in running]
        backfill_results(live_results, tsdb_dir, progress)
        progress(f"register: {len(new)} jobs")
        for demo, result in zip([*ended, *running], [*results, *live_results], strict=True):
            register(demo, result, teams, now)
    live = [
        asdict(d.spec) | {"disabled": sorted(d.spec.disabled)} for d in planned if not d.ended
    ]  # step-level (workload) jobs have all ended: live specs stay plain JSON
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / LIVE_SPECS_FILE).write_text(json.dumps(live, indent=1))
    return {"jobs_created": len(new), "jobs_existing": len(known), "live_jobs": len(live)}


def host_sync_trace(steps: int = 6, kernels_per_step: int = 20, syncs_per_step: int = 3) -> bytes:
    """A small Kineto trace whose step calls cudaStreamSynchronize (think `.item()`) a few times."""
    events: list[dict[str, Any]] = []
    t, corr = 1000.0, 1
    every = max(1, kernels_per_step // syncs_per_step)
    for step in range(steps):
        step_start = t
        for k in range(kernels_per_step):
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": t, "dur": 6.0, "args": {"correlation": corr}})  # fmt: skip
            events.append({"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n",
                           "pid": 0, "tid": 7, "ts": t + 8, "dur": 120.0,
                           "args": {"correlation": corr, "stream": 7, "device": 0}})  # fmt: skip
            corr, t = corr + 1, t + 130
            if k % every == 0:
                events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1,
                               "tid": 1, "ts": t, "dur": 400.0, "args": {"correlation": corr}})  # fmt: skip
                corr, t = corr + 1, t + 900  # the CPU waits, then prepares the next launch: the GPU idles
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1,
                       "tid": 1, "ts": step_start, "dur": t - step_start})  # fmt: skip
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
        "distributedInfo": {"rank": 0, "world_size": 8, "backend": "nccl"},
        "traceEvents": events,
    }
    return json.dumps(trace).encode()


SEED_GEMM = {
    "NVIDIA A100-SXM4-80GB": (
        "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16"
    ),
    "NVIDIA H100 80GB HBM3": (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize1x1x1_wgmma"
    ),
}
SEED_NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


class _Trace:
    """Kineto Chrome-trace events (documented format: X events, cpu_op / cuda_runtime / kernel categories,
    correlation ids linking a launch to its kernel, ProfilerStep#N annotations, baseTimeNanoseconds)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op") -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                            "args": {}})  # fmt: skip

    def kernel(self, name: str, launch_ts: float, ts: float, dur: float, stream: int = 7) -> None:
        self.corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": launch_ts, "dur": 5.0, "args": {"correlation": self.corr}})  # fmt: skip
        args = {"device": 0, "stream": stream, "correlation": self.corr}
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts,
                            "dur": dur, "args": args})  # fmt: skip

    def document(self, gpu: str, sms: int, rank: int, world: int, start_unix: float, span_us: float) -> bytes:
        window = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": 1,
                  "ts": 0.0, "dur": span_us}  # fmt: skip
        return json.dumps({
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": gpu, "numSms": sms}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "baseTimeNanoseconds": int(start_unix * 1e9),
            "traceEvents": [*self.events, window],
        }).encode()  # fmt: skip


def seed_input_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 1, run 1 (rank 0 of 8 A100s): each 2 s step opens with the main process in the
    DataLoader for 1.2 s (0.45 s waiting for the workers, then tokenising: seed 002 section 4.1) while the
    GPU has nothing queued, then 40 GEMMs of 15 ms launched 20 ms apart (0.8 s, 75 % busy).
    Hand-derived: DataLoader 60 % of the step, the GPU idle under it the whole time -> an input stall."""
    t = _Trace()
    step = 2_000_000.0
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        t.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s, 1_200_000.0)
        for i in range(40):
            at = s + 1_200_000.0 + 20_000.0 * i
            t.cpu("aten::mm", at, 30.0)
            t.kernel(SEED_GEMM["NVIDIA A100-SXM4-80GB"], at + 20.0, at + 40.0, 15_000.0)
    return t.document("NVIDIA A100-SXM4-80GB", 108, 0, 8, start_unix, steps * step + 100.0)


def seed_collective_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 2 (rank 0 of 32 H100s): each 1.5 s step is 1.0 s of GEMMs (50 x 20 ms, back to back)
    then a 0.5 s all-reduce that no compute overlaps. Hand-derived: communication 33 % of the step, 0 %
    overlapped -> an exposed collective."""
    t = _Trace()
    step = 1_500_000.0
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        for i in range(50):
            at = s + 20_000.0 * i
            t.cpu("aten::mm", at, 30.0)
            t.kernel(SEED_GEMM["NVIDIA H100 80GB HBM3"], at + 10.0, at + 40.0, 19_950.0)
        t.cpu("nccl:all_reduce", s + 1_000_000.0, 60.0)
        t.kernel(SEED_NCCL, s + 1_000_010.0, s + 1_000_050.0, 499_900.0)
    return t.document("NVIDIA H100 80GB HBM3", 132, 0, 32, start_unix, steps * step + 100.0)


SEED_ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>"
)
SEED_TINY = "void at::native::elementwise_kernel<128, 2, at::native::AUnaryFunctor<float, float, float>>"
SEED_FUSED = "triton_per_fused__to_copy_add_mul_native_layer_norm_0"


def _lora_blocks(t: _Trace, start: float, between: str, between_us: float) -> float:
    """Case 1's forward and backward GEMM work, the same in every run (the batch did not change): 40 GEMMs
    of 15 ms, each followed by a `between_us` kernel `between` (element-wise; fused: Triton), back to back on
    the GPU while the host launches ahead. Returns where the GPU work ends."""
    gemm = SEED_GEMM["NVIDIA A100-SXM4-80GB"]
    at = start
    for _ in range(40):
        t.cpu("aten::mm", at - 40.0, 30.0)
        t.kernel(gemm, at - 20.0, at, 15_000.0)
        t.kernel(between, at - 10.0, at + 15_000.0, between_us)
        at += 15_000.0 + between_us
    return at


def seed_tiny_kernels_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 1, run 2 (input fixed, 0.97 s steps, 68 % busy): the batch is ready (DataLoader 2 ms,
    prefetched by the workers), the same 40 GEMMs plus a 1.5 ms element-wise kernel each (0.66 s), then an
    unfused optimizer over the LoRA parameters: 770 kernels of 1-3 us, each launched after ~0.4 ms of
    Python on the host (seed 002 section 4.1: "many 1-3 us kernels"). Hand-derived: GPU idle 31.8 % of
    the step, all of it in launch gaps under 1 ms with the host busy; 91 % of the kernels under 10 us."""
    t = _Trace()
    step = 970_000.0
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        t.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", s, 2_000.0)
        at = _lora_blocks(t, s + 2_000.0, SEED_ELEMENTWISE, 1_500.0)
        for j in range(770):
            t.cpu("aten::add_", at, 380.0)
            t.kernel(SEED_TINY, at + 385.0, at + 395.0, 1.0 + j % 3)
            at += 400.0
    return t.document("NVIDIA A100-SXM4-80GB", 108, 0, 8, start_unix, steps * step + 100.0)


def seed_fused_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 1, run 3 (torch.compile, 0.78 s steps, 85 % busy): the same 40 GEMMs each followed by one
    fused Triton kernel of 1.6 ms (0.664 s), the optimizer fused into two kernels, and 0.112 s of host
    time in the optimizer step with the GPU idle (not the input pipeline, no launch gaps, no sync: the
    remainder the seed's author left, "limited by power and communication"). Hand-derived: GPU busy 85.4 %
    of the step, no rule's pattern."""
    t = _Trace()
    step = 780_000.0
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        t.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", s, 2_000.0)
        at = _lora_blocks(t, s + 2_000.0, SEED_FUSED, 1_600.0)
        t.cpu("Optimizer.step#AdamW.step", at, s + step - at - 100.0)
        for _ in range(2):
            t.kernel("triton_for_fused__foreach_addcdiv_mul_0", at + 10.0, at + 20.0, 1_000.0)
            at += 1_000.0
    return t.document("NVIDIA A100-SXM4-80GB", 108, 0, 8, start_unix, steps * step + 100.0)


def seed_overlapped_trace(start_unix: float, steps: int = 3) -> bytes:
    """Seed case 2 after the fix (rank 0 of 32 H100s, 1.05 s steps): the same 1.0 s of GEMMs (50 x 20 ms),
    the gradients all-reduced in five 90 ms buckets on NCCL's own stream as the backward pass produces
    them (from 0.5 s into the step), and only the last 50 ms bucket after the compute. Hand-derived:
    communication 0.5 s a step as before, 90 % of it overlapped with compute; 0.05 s exposed."""
    t = _Trace()
    step = 1_050_000.0
    gemm = SEED_GEMM["NVIDIA H100 80GB HBM3"]
    for k in range(steps):
        s = k * step
        t.cpu(f"ProfilerStep#{k + 1}", s, step, cat="user_annotation")
        for i in range(50):
            at = s + 20_000.0 * i
            t.cpu("aten::mm", at, 30.0)
            t.kernel(gemm, at + 10.0, at + 40.0, 19_950.0)
        for j in range(5):
            at = s + 500_000.0 + 100_000.0 * j
            t.cpu("nccl:all_reduce", at, 60.0)
            t.kernel(SEED_NCCL, at + 10.0, at + 50.0, 90_000.0, stream=13)
        t.cpu("nccl:all_reduce", s + 1_000_000.0, 60.0)
        t.kernel(SEED_NCCL, s + 1_000_010.0, s + 1_000_050.0, 49_900.0, stream=13)
    return t.document("NVIDIA H100 80GB HBM3", 132, 0, 32, start_unix, steps * step + 100.0)


#: Every seed run's profiler trace (rank 0, captured 30 minutes into the job), with the step structure of
#: its metrics: 2 s -> 0.97 s -> 0.78 s for case 1, 1.5 s -> 1.05 s for case 2.
SEED_TRACES = {
    "demo-seed1-run1": seed_input_trace,
    "demo-seed1-run2": seed_tiny_kernels_trace,
    "demo-seed1-run3": seed_fused_trace,
    "demo-seed2": seed_collective_trace,
    "demo-seed2-run2": seed_overlapped_trace,
}


#: How long `finish` waits for Prometheus to scrape the simulated exporter before its first poll.
LIVE_WAIT_S = 180.0


def live_data_until(client: PrometheusClient, job_ids: list[str]) -> dict[str, float]:
    """The newest GPU_UTIL sample Prometheus holds for each running demo job (Unix s; absent = none in
    Prometheus' 5 min lookback)."""
    if not job_ids:
        return {}
    ids = "|".join(job_ids)  # demo ids: letters, digits and '-', nothing a regex would read specially
    query = f'max by (hpc_job) (timestamp(DCGM_FI_DEV_GPU_UTIL{{hpc_job=~"{ids}"}}))'
    return {s.labels.get("hpc_job", ""): s.value for s in client.instant(query)}


def wait_for_live_data(
    client: PrometheusClient,
    job_ids: list[str],
    since: float,
    timeout_s: float = LIVE_WAIT_S,
    progress: Progress = _quiet,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> bool:
    """Wait until Prometheus holds a sample newer than `since` for every running demo job, i.e. it has
    scraped the simulated exporter since `finish` began; True when it has, False after `timeout_s`.

    Why (issue 28 item 3): the running jobs' backfilled data ends when `load` wrote it; a poll before the
    exporter is scraped sees data minutes old, and the demo opened with "Ingestion stale" alerts."""
    deadline = clock() + timeout_s
    while True:
        try:
            latest = live_data_until(client, job_ids)
        except PrometheusError as exc:
            latest, error = {}, str(exc)
        else:
            error = ""
        behind = [j for j in job_ids if latest.get(j, 0.0) < since]
        if not behind:
            return True
        if clock() >= deadline:
            progress(
                f"live data: Prometheus has not scraped {', '.join(behind)} from the simulated exporter "
                f"in {timeout_s:.0f} s{f' ({error})' if error else ''}; is the web server running with "
                "DEMO_STATE_DIR? Their first poll reads the backfilled data only"
            )
            return False
        sleep(5.0)


def attach_traces(progress: Progress = _quiet) -> int:
    """Upload and parse each demo trace (the host-sync job's, every seed run's) once; returns how many
    were attached now."""
    attached = 0
    makers: dict[str, Callable[[float], bytes]] = {
        HOST_SYNC_JOB: lambda _start: host_sync_trace(),
        **SEED_TRACES,
    }
    for job_id, make in makers.items():
        job = Job.objects.filter(external_id=job_id).first()
        if job is None or job.artifacts.exists():
            continue
        doc = make(job.started_at.timestamp() + 1800.0)
        artifact = store_upload(job, io.BytesIO(doc), filename="rank0.pt.trace.json", parse=False)
        parse_artifact(artifact.pk)
        attached += 1
    progress(f"traces: {attached} attached and parsed")
    return attached


def finish(
    progress: Progress = _quiet, *, wait_live_s: float = LIVE_WAIT_S, client: PrometheusClient | None = None
) -> dict[str, Any]:
    """After Prometheus has loaded the demo blocks (and, in `make demo`, the web server serving the
    simulated exporter has started): wait until the running jobs' data is being scraped, ingest everything,
    attach the profiler traces, promote the healthy history runs to baselines, and diagnose again so every
    finding code appears somewhere."""
    began = time.time()
    client = client or prometheus_client()
    live = list(
        Job.objects.filter(registered_by=Job.Provenance.DEMO, status=Job.Status.RUNNING)
        .order_by("external_id")
        .values_list("external_id", flat=True)
    )
    caught_up = True
    if live and wait_live_s > 0:
        progress(f"live data: waiting for Prometheus to scrape {len(live)} running jobs")
        caught_up = wait_for_live_data(client, live, began, wait_live_s, progress)
    progress("ingest: polling running jobs and finalizing ended ones")
    report = ingest_once(client)
    progress(
        f"ingest: polled {len(report['polled'])}, finalized {len(report['finalized'])}, "
        f"stale {len(report['stale'])}"
    )
    attach_traces(progress)
    promoted = 0
    for candidate in Job.objects.filter(external_id__startswith="demo-h", status=Job.Status.FINALIZED):
        healthy = (
            candidate.mfu is not None
            and candidate.mfu >= 0.4
            and not candidate.findings.exclude(severity=Finding.Severity.INFO).exists()
        )
        if healthy and not candidate.baselines.exists():
            promote(candidate, SYSTEM)
            promoted += 1
    progress(f"baselines: {promoted} runs promoted")
    for other in Job.objects.filter(external_id__startswith="demo-h"):
        run_diagnosis(other)
    progress("diagnosis: history re-diagnosed against the baselines")
    return {**report, "baselines_promoted_runs": promoted, "live_caught_up": caught_up}


def truncate(result: SimResult, until: float) -> SimResult:
    """Only what has happened: a running job's samples stop at `until` (the live exporter goes on)."""
    n = int(np.searchsorted(result.timestamps, until, side="right"))
    if n >= len(result.timestamps):
        return result
    tp = result.throughput
    return replace(
        result,
        timestamps=result.timestamps[:n],
        fields={k: v[:, :n] for k, v in result.fields.items()},
        throughput=replace(tp, tokens_per_s=tp.tokens_per_s[:n], tokens_total=tp.tokens_total[:n]),
    )


def live_specs(state_dir: Path) -> list[SimSpec]:
    """The running demo jobs' specs, as written by `load`."""
    path = state_dir / LIVE_SPECS_FILE
    if not path.exists():
        return []
    specs = []
    for raw in json.loads(path.read_text()):
        raw["hosts"] = tuple(raw["hosts"])
        raw["disabled"] = frozenset(raw["disabled"])
        specs.append(SimSpec(**raw))
    return specs


@lru_cache(maxsize=4)
def _live_results(path: str, mtime: float) -> tuple[SimResult, ...]:
    # Cached per specs file version: simulating a week of a job takes about a second.
    return tuple(simulate(spec) for spec in live_specs(Path(path).parent))


def live_exporter_text(state_dir: Path, at: float) -> str:
    """dcgm-exporter's /metrics text for the running demo jobs at time `at`, plus their token counters."""
    path = state_dir / LIVE_SPECS_FILE
    if not path.exists():
        return ""
    results = _live_results(str(path), path.stat().st_mtime)
    lines = [exporter_text(results, at)]
    tokens = []
    for res in results:
        idx = int(np.searchsorted(res.timestamps, at, side="right")) - 1
        if 0 <= idx < len(res.timestamps):
            labels = f'job_id="{res.spec.job_id}",hostname="{res.gpus[0].hostname}"'
            tokens.append(f"{TOKENS_METRIC}{{{labels}}} {int(res.throughput.tokens_total[idx])}")
    if tokens:
        lines += [f"# TYPE {TOKENS_METRIC} counter", *tokens, ""]
    return "\n".join(lines)


def live_exporter_view(request: HttpRequest) -> HttpResponse:
    """The simulated exporter endpoint (only when DEMO_STATE_DIR is set; 404 otherwise)."""
    if not settings.DEMO_STATE_DIR:
        raise Http404("the demo exporter is off")
    body = live_exporter_text(Path(settings.DEMO_STATE_DIR), time.time())
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
