"""Two regimes: the seeds' case studies as dcgm-exporter records them, variants the rules were not tuned
on, unexplained waste, short jobs, serving advice and the evaluation's idle share. Pure: no Django.

Every job here is a step-level workload (jobs.simulate.exporter) recorded through NVML's <= 1 s window,
DCGM's collect-interval averages (30 s, dcgm-exporter's default), per-target scrape offsets and ~1 %
failed scrapes, then read back as ingestion would (testing.signals_from_sim).
"""

from __future__ import annotations

import copy
import functools

import pytest

from benchmarks.diagnosis_inputs import input_from_sim
from jobs.diagnosis import DiagnosisInput, Finding, Severity, diagnose
from jobs.diagnosis.features import Features
from jobs.diagnosis.rules import RULES
from jobs.simulate import SimSpec, simulate
from jobs.simulate.exporter import Exporter, Workload, collective_wait, healthy, input_stall
from jobs.simulate.seeds import SEED_CASES


@functools.lru_cache(maxsize=64)
def _recorded(workload: Workload, gpus: int, gpu_model: str, scrape: float, seed: int, hours: float,
              lost: bool) -> DiagnosisInput:  # fmt: skip
    hosts = tuple(f"n{h}" for h in range(-(-gpus // 8)))
    exporter = Exporter(scrape_s=scrape, node_lost=(0.5, 600.0) if lost else None)
    res = simulate(SimSpec(gpus=gpus, gpu_model=gpu_model, hosts=hosts, duration_s=hours * 3600,
                           workload=workload, exporter=exporter, seed=seed))  # fmt: skip
    return input_from_sim(res)


H100 = "NVIDIA H100 80GB HBM3"


def recorded(
    workload: Workload,
    *,
    gpus: int = 16,
    gpu_model: str = H100,
    scrape: float = 15.0,
    seed: int = 4,
    hours: float = 2.0,
    lost: bool = True,
) -> DiagnosisInput:
    return copy.copy(_recorded(workload, gpus, gpu_model, scrape, seed, hours, lost))  # tests may change it


def warnings_of(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings if f.severity.rank >= Severity.WARNING.rank}


# --------------------------------------------------------------------------------- the seed cases


@pytest.mark.parametrize("scrape", [15.0, 30.0])
@pytest.mark.parametrize("name", ["seed1-run1", "seed1-run2", "seed2"])
def test_the_seed_cases_get_the_seeds_diagnosis_at_15_and_30_s(name: str, scrape: float) -> None:
    # Case 1 run 1: 2 s steps, 33 % util, 0.45 s input wait per step (seed: DataLoader/tokenizer);
    # run 2: 68 % util with 1-3 us kernels (seed: fuse them); case 2: 1.5 s steps with a 0.5 s exposed
    # collective (seed: NCCL). All far below the 15-30 s sampling: the unresolved regime.
    case = SEED_CASES[name]
    inp = recorded(case.workload, gpus=case.gpus, gpu_model=case.gpu_model, scrape=scrape, hours=1.0)
    found = {f.code: f for f in diagnose(inp)}
    assert case.expected in warnings_of(list(found.values())), [(f.code, f.severity) for f in found.values()]
    f = found[case.expected]
    # Honest, lower confidence; its dollars; the resolution stated; the capture that would confirm it.
    assert 0.3 <= f.confidence <= 0.6
    assert f.waste_per_day_usd is not None and f.waste_per_day_usd > inp.material_waste_usd_per_day
    ev = {e.label: e.value for e in f.evidence}
    assert ev["regime"] == "unresolved"
    assert f"GPU_UTIL sampled every {scrape:g} s" in ev["effective resolution"]
    assert f"per-step patterns < {4 * scrape:g} s are not visible" in ev["effective resolution"]
    assert "nsys profile -t cuda,nvtx,osrt,nccl --duration 60" in f.recommendation
    if case.expected == "data_pipeline_stall":
        assert "py-spy record --pid" in f.recommendation


@pytest.mark.parametrize("scrape", [15.0, 30.0])
def test_the_seed_case_1_third_run_gets_no_warning(scrape: float) -> None:
    # 85 % resident with large kernels: MFU ~0.37 against 0.45. What is left is unexplained money, shown
    # as context (18 % of the cost is below the 25 % warning share), not a warning.
    case = SEED_CASES["seed1-run3"]
    inp = recorded(case.workload, gpus=8, gpu_model=case.gpu_model, scrape=scrape, hours=1.0)
    found = diagnose(inp)
    assert warnings_of(found) == set()
    assert [f.code for f in found] == ["unexplained_waste"]
    assert found[0].waste_per_day_usd == pytest.approx(inp.waste_per_day_usd)


def test_the_three_runs_of_case_1_improve_as_in_the_seed() -> None:
    util = []
    for name in ("seed1-run1", "seed1-run2", "seed1-run3"):
        case = SEED_CASES[name]
        lk = Features(recorded(case.workload, gpus=8, gpu_model=case.gpu_model, hours=1.0)).looks
        assert lk is not None and lk.util_mean is not None
        util.append(lk.util_mean)
    # 33 % -> 68 % -> 85 % (seed 002, section 4.1), within the exporter's sampling noise.
    assert util == pytest.approx([0.33, 0.68, 0.85], abs=0.04)


# ------------------------------------------------------------------------ variants not tuned on


@pytest.mark.parametrize(
    ("workload", "expected"),
    [
        # Resolved (120 s steps, 8 samples at 15 s): the shape is visible.
        (input_stall(120.0, 0.25), "data_pipeline_stall"),  # synchronised drops, links quiet
        (input_stall(120.0, 0.25, sync="staggered"), "data_pipeline_stall"),  # out of phase across nodes
        (collective_wait(120.0, 0.3), "communication_wait"),  # NCCL spins: SM sawtooth, util high
        (collective_wait(120.0, 0.3, mode="drop"), "communication_wait"),  # util drops, data still moves
        # Unresolved (2 s and 1.5 s steps).
        (input_stall(2.0, 0.3, sync="staggered"), "data_pipeline_stall"),
        (collective_wait(1.5, 0.3, mode="drop"), "communication_wait"),
    ],
)
def test_variants_the_rules_were_not_tuned_on(workload: Workload, expected: str) -> None:
    found = diagnose(recorded(workload, seed=9))
    assert expected in warnings_of(found), [(f.code, f.severity.value) for f in found]
    other = {"data_pipeline_stall", "communication_wait"} - {expected}
    assert not other & warnings_of(found)


@pytest.mark.parametrize("step", [0.2, 2.0, 60.0])
def test_healthy_step_patterns_at_any_resolution_get_no_finding(step: float) -> None:
    for scrape in (5.0, 15.0, 60.0):
        assert diagnose(recorded(healthy(step), scrape=scrape, hours=1.0)) == []


# ---------------------------------------------------------------------------- unexplained waste


def test_material_waste_no_rule_explains_gets_unexplained_waste_with_what_is_missing() -> None:
    # A collective wait with quiet links whose NCCL kernels spin (util ~100 %, SM 0.9 x 0.7 + 0.15 x 0.3
    # = 0.68, NVLink ~7 GB/s): 1.5 s steps at 15 s are unresolved and no look applies (not heavy links, not
    # false saturation at SM >= 0.5, not launch-bound at 100 % util), so the money is unexplained.
    inp = recorded(collective_wait(1.5, 0.3, links="idle"))
    found = diagnose(inp)
    assert [f.code for f in found] == ["unexplained_waste"]
    f = found[0]
    assert f.waste_per_day_usd == pytest.approx(inp.waste_per_day_usd)
    # 1 - MFU/0.45 here is ~30 % of the cost: at least a quarter unexplained is a warning.
    assert f.severity is Severity.WARNING
    labels = [e.label for e in f.evidence]
    assert "unexplained waste/day" in labels and "effective resolution" in labels
    assert "py-spy record" in f.recommendation and "nsys profile" in f.recommendation


def test_unexplained_waste_respects_the_material_threshold_and_explained_money() -> None:
    inp = recorded(collective_wait(1.5, 0.3, links="idle"))
    inp.material_waste_usd_per_day = inp.waste_per_day_usd + 1.0
    assert diagnose(inp) == []
    # The seed case 1 stall: data_pipeline_stall explains (almost) all of it: nothing material is left.
    case = SEED_CASES["seed1-run1"]
    stall = recorded(case.workload, gpus=8, gpu_model=case.gpu_model, hours=1.0)
    codes = [f.code for f in diagnose(stall)]
    assert codes == ["data_pipeline_stall"]


def test_unexplained_waste_with_mfu_unknown_uses_the_idle_lower_bound() -> None:
    inp = recorded(collective_wait(1.5, 0.3, links="idle"))
    inp.waste_per_day_usd, inp.idle_waste_per_day_usd = None, 120.0
    found = diagnose(inp)
    assert [f.code for f in found] == ["unexplained_waste"]
    assert found[0].waste_per_day_usd == 120.0 and "lower bound" in found[0].title


# ------------------------------------------------------------------------------ short jobs, kind


def test_a_14_minute_pod_with_15_samples_gets_no_warning() -> None:
    # 840 s at 60 s = 15 samples with a stall every 4 samples (240 s): 3-4 cycles are not evidence.
    res = simulate(SimSpec(scenario="data_pipeline_stall", gpus=8, duration_s=840, step_s=60, seed=2))
    found = diagnose(input_from_sim(res))
    assert not warnings_of(found) - {"unexplained_waste"}
    stall = [f for f in found if f.code == "data_pipeline_stall"]
    assert stall and stall[0].severity is Severity.INFO


def test_inference_jobs_get_serving_advice() -> None:
    idle = input_from_sim(simulate(SimSpec(scenario="idle_gpus", gpus=8, seed=1)), kind="inference")
    headroom = input_from_sim(simulate(SimSpec(scenario="memory_headroom", gpus=8, seed=1)), kind="inference")
    for code, inp in (("idle_gpus", idle), ("memory_headroom", headroom)):
        f = RULES[code](inp, Features(inp))
        assert f is not None
        assert "autoscale" in f.recommendation.lower() or "right-size" in f.recommendation.lower()
        assert "micro-batch" not in f.recommendation and "launcher" not in f.recommendation
    training = input_from_sim(simulate(SimSpec(scenario="memory_headroom", gpus=8, seed=1)))
    assert "micro-batch" in RULES["memory_headroom"](training, Features(training)).recommendation


def test_idle_gpus_prints_the_evaluations_idle_share() -> None:
    res = simulate(SimSpec(scenario="idle_gpus", gpus=8, seed=1))
    own = input_from_sim(res)
    f_own = RULES["idle_gpus"](own, Features(own))
    # 2 of 8 GPUs idle from 10 % of the job on: ~22.5 % of the GPU time by the rule's own count.
    share = {e.label: e.value for e in f_own.evidence}["share of the job's GPU time idle"]
    assert share == pytest.approx(22.5, abs=1.5)
    given = input_from_sim(res, idle_share=0.2417)  # what the stored evaluation says
    f = RULES["idle_gpus"](given, Features(given))
    ev = {e.label: e.value for e in f.evidence}
    assert ev["share of the job's GPU time idle (the job's evaluation)"] == 24.2
    assert f.impact == pytest.approx(0.2417)


def test_the_variant_matrix_scores_both_regimes() -> None:
    from benchmarks.diagnosis_harness import format_matrix, matrix_jobs, run_direct

    jobs = matrix_jobs(
        scrapes=(15.0,), steps=(2.0, 120.0), windows=(1.0,), comm_sm=(0.65,), duration_s=1800.0
    )
    # 2 steps x 10 variants (healthy, 3 input stalls, 4 collectives, 1 at SM 65 %, tiny kernels); 120 s
    # spans 8 samples at 15 s (resolved), 2 s does not (unresolved).
    assert len(jobs) == 20 and {j.regime for j in jobs} == {"resolved", "unresolved"}
    assert all(j.spec.exporter is not None and j.spec.exporter.nvml_window_s == 1.0 for j in jobs)

    def diagnose_job(job, sim):  # type: ignore[no-untyped-def]
        inp = input_from_sim(sim)
        return diagnose(inp), inp.waste_per_day_usd

    text = format_matrix(run_direct(jobs, diagnose_job))
    assert "resolved" in text and "unresolved" in text and "data_pipeline_stall" in text


def test_the_seed_cases_with_the_default_exporter_counters_name_what_is_missing() -> None:
    # dcgm-exporter's default counters lack SM_ACTIVE and NVLink TX/RX: case 2 reads tensor active (0.36
    # < 0.40) and NVLINK_BANDWIDTH_TOTAL / 2 instead, at a lower confidence that names sm_active.
    from jobs.metrics.signals import DEFAULT_DISABLED

    case = SEED_CASES["seed2"]
    res = simulate(SimSpec(gpus=32, gpu_model=case.gpu_model, hosts=tuple(f"d{h}" for h in range(4)),
                           duration_s=3600, workload=case.workload, exporter=Exporter(), seed=1,
                           disabled=DEFAULT_DISABLED))  # fmt: skip
    f = next(f for f in diagnose(input_from_sim(res)) if f.code == "communication_wait")
    assert f.severity is Severity.WARNING and "sm_active" in f.missing_signals and f.confidence < 0.5


def test_a_gpu_util_sample_aliased_onto_the_idle_phase_is_not_an_idle_gpu() -> None:
    # 20 s steps with 6 s of input wait, scraped every 60 s (three steps): a node's point samples can
    # land in the wait of every step for the whole job; GR_ENGINE_ACTIVE (its 30 s average) reads ~0.7.
    def codes(disabled: frozenset[str]) -> set[str]:
        res = simulate(SimSpec(gpus=16, hosts=("n0", "n1"), duration_s=3600, seed=2, disabled=disabled,
                               workload=input_stall(20.0, 0.3, sync="staggered"),
                               exporter=Exporter(scrape_s=60.0, node_lost=(0.5, 600.0))))  # fmt: skip
        return {f.code for f in diagnose(input_from_sim(res))}

    assert "idle_gpus" in codes(frozenset({"gr_engine_active"}))  # the aliasing, GPU_UTIL alone
    found = codes(frozenset())
    assert "idle_gpus" not in found and "data_pipeline_stall" in found
