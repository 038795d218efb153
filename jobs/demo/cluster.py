"""The demo cluster: its teams and users, and the jobs it runs -- a showcase job per simulator scenario,
running jobs, six weeks of history, the seed runs and a model server -- each simulated (jobs.simulate) up
to now and registered as a scheduler would.

Every demo job is a simulator scenario backfilled into Prometheus with promtool (`loader`), so its page,
MFU, cost and findings come out of the same pipeline as a real job's. Running jobs keep receiving data
from the simulated dcgm-exporter endpoint (`live`) that the demo's Prometheus scrapes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np
from django.contrib.auth import get_user_model
from django.db import transaction

from jobs.access.ownership import Claimant
from jobs.evaluation.flops import utilisation
from jobs.intake.registry import register_job
from jobs.metrics.promql import label_matcher
from jobs.metrics.throughput import mark_free_form
from jobs.models import Job, Membership, Team
from jobs.simulate import (
    SCENARIOS,
    SimResult,
    SimSpec,
    registration_body,
    simulate,
)
from jobs.simulate.exporter import Exporter
from jobs.simulate.seeds import SEED_CASES
from jobs.simulate.vllm import (
    GENERATION_TOKENS_METRIC,
    PROMPT_TOKENS_METRIC,
    EngineSeries,
    ServingLoad,
    server_pod,
    simulate_server,
    truncate_engines,
)

DEMO_PASSWORD = "demo-password"
TEAMS = (("llm-pretrain", "LLM pretraining"), ("vision", "Vision"), ("speech", "Speech"))
MEMBERS = (("alice", "llm-pretrain"), ("bob", "vision"), ("carol", "speech"))
HOST_SYNC_JOB = "demo-4850"
IDLE_LIVE_JOB = "demo-4902"  # running, goes idle after 90 minutes: shows an alert
SERVING_JOB = "demo-4903"  # running: a vLLM server whose GPUs follow its request load (issue 25)
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
    #: A model server's load (jobs.simulate.vllm): its GPUs follow it and its engine exports FLOP counters.
    serving: ServingLoad | None = None


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
    # A model server (issue 25): Llama 3.1 8B served by vLLM with --enable-mfu-metrics, tensor parallel
    # over 2 H100s of one node, in Kubernetes (its GPUs' series carry namespace/pod, as do its engine's
    # through a ServiceMonitor), registered by that label selector. Started 6 hours ago: the afternoon's
    # rising load, its bursts, the GPUs following it; MFU from the engine's own FLOP counter.
    spec = SimSpec(scenario="healthy", gpus=2, hosts=hosts(2), job_id=SERVING_JOB, job_labels="kubernetes",
                   namespace="llm-serving", start=t_now - 6 * 3600, duration_s=24 * 7 * 3600, step_s=30.0,
                   seed=230, model_params=8.0e9, n_layers=32, hidden=4096, n_heads=32,
                   seq_len=8192)  # fmt: skip
    jobs.append(DemoJob(spec, "llm-pretrain", "llama-3.1-8b-vllm-serving", "llama-3.1-8b-instruct",
                        ended=False, kind="inference", serving=ServingLoad()))  # fmt: skip
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
    """Register a demo job as a scheduler would (explicit GPUs, a throughput PromQL expression; a model
    server by its pod's label selector, its throughput the engine's token counters)."""
    spec = demo.spec
    serving = _serving_registration(demo) if demo.serving is not None else {}
    body = registration_body(
        result,
        team=teams[demo.team],
        name=demo.name,
        model=demo.model,
        ended=demo.ended,
        # rate() needs two samples in its window: coarse history (600 s samples) gets a wider one.
        rate_window_s=max(300, int(3 * spec.step_s)),
        owner=next(u for u, t in MEMBERS if t == demo.team),
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
        **({"parallelism": {"tp": 1, "pp": 1, "dp": spec.gpus, "ep": 1}} | serving),
    )
    if body["ended_at"] is not None and body["ended_at"] >= now:
        body["ended_at"] = None  # still running as far as the demo's clock goes
    return register_job(body, Claimant.platform(Job.Provenance.DEMO, "demo loader")).job


def _serving_registration(demo: DemoJob) -> dict[str, object]:
    """What a model server's deployment registers: its pod's labels as the selector (the join to its GPUs'
    dcgm-exporter series and to its engine's series, README "A serving job's engine MFU"), tensor
    parallelism over its GPUs, and as throughput every token the engine runs a forward pass for (prompt and
    generated: both are the forward-FLOPs MFU's tokens), read from vLLM's token counters by that selector
    (PromQL the platform writes itself, so not a `$job` template)."""
    spec = demo.spec
    selector = {"namespace": spec.namespace, "pod": server_pod(spec)}
    matchers = ",".join(label_matcher(k, v) for k, v in selector.items())
    window = f"{max(300, int(3 * spec.step_s))}s"
    query = " + ".join(
        f"sum(rate({metric}{{{matchers}}}[{window}]))"
        for metric in (PROMPT_TOKENS_METRIC, GENERATION_TOKENS_METRIC)
    )
    return {
        "gpus": [],
        "selector": selector,
        "parallelism": {"tp": spec.gpus, "pp": 1, "dp": 1, "ep": 1},
        "throughput_query": mark_free_form(query),
    }


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
    if demo.serving is not None:
        return truncate(simulate_server(demo.spec, demo.serving).result, now.timestamp())
    result = simulate(demo.spec)
    if demo.batch is not None:
        result = step_throughput(result, demo.batch)
    return truncate(result, now.timestamp())


def engine_series(demo: DemoJob, now: datetime) -> EngineSeries | None:
    """A model server's engine counters up to `now` (None for a job that serves nothing)."""
    if demo.serving is None:
        return None
    return truncate_engines(simulate_server(demo.spec, demo.serving).engines, now.timestamp())


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
