"""Host levels from node_exporter in the rules: an input stall with busy CPUs or iowait, vs a host that
idles (sync / too few workers), vs a network wait (InfiniBand traffic) or a peer wait (quiet links)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from benchmarks.diagnosis_inputs import input_from_sim, signals_from_sim
from jobs.diagnosis.base import DiagnosisInput
from jobs.diagnosis.features import Features
from jobs.diagnosis.host_looks import HostLook, host_look
from jobs.diagnosis.rules import communication_wait, data_pipeline_stall
from jobs.simulate import SimSpec, simulate
from jobs.simulate import node_exporter as N
from jobs.simulate.exporter import Exporter, Workload, collective_at_sm, input_stall


@functools.lru_cache(maxsize=16)
def _job(workload: Workload, gpus: int, behaviour: str | None) -> DiagnosisInput:
    hosts = tuple(f"n{h}" for h in range(-(-gpus // 8)))
    res = simulate(SimSpec(gpus=gpus, hosts=hosts, duration_s=3600.0, workload=workload,
                           exporter=Exporter(scrape_s=15.0, nvml_window_s=1.0), seed=1))  # fmt: skip
    sigs = signals_from_sim(res)
    if behaviour is not None:
        N.add_to(sigs, N.simulate_hosts(hosts, res.timestamps, behaviour, n_cpus=4, seed=2))
    return input_from_sim(res, signals=sigs, kind="training")


SEED1 = input_stall(2.0, 2.0 / 3.0)  # the seeds' case 1: waits 2/3 of each 2 s step


def test_levels_classify_the_input_side_by_hand_derived_thresholds() -> None:
    def look(busy: float, iowait: float, rx: float = 0.0) -> HostLook:
        return HostLook(2, busy, iowait, 0.0, rx, 0.0, 0.6)

    assert look(0.92, 0.01).input_cause == "cpu"  # >= 70 % busy
    assert look(0.12, 0.25).input_cause == "io"  # >= 10 % iowait
    assert look(0.08, 0.0, rx=2.4e9).input_cause == "remote"  # >= 0.5 GB/s in, CPUs quiet
    assert look(0.02, 0.002).input_cause == "idle"  # < 25 % busy, < 5 % iowait
    assert look(0.5, 0.06).input_cause is None  # in between: says nothing
    assert HostLook(2, None, None, None, None, 6e9, None).network_busy is True  # 6 >= 5 GB/s RX+TX
    assert HostLook(2, None, None, None, None, 0.4e9, None).network_busy is False


def test_without_node_exporter_there_is_no_host_look() -> None:
    assert host_look(Features(_job(SEED1, 8, None))) is None


@pytest.mark.parametrize(
    ("behaviour", "said", "advice"),
    [
        ("cpu_bound_input", "the input pipeline is CPU-bound (host CPUs busy)", "DALI"),
        ("io_bound_input", "the input pipeline waits on storage (host iowait)", "local NVMe"),
        ("remote_input", "the input comes over the network", "cache it locally"),
        ("host_sync", "a host synchronisation or too few DataLoader workers", "a trace shows them"),
    ],
)
def test_seed_case_1_names_the_host_side_cause(behaviour: str, said: str, advice: str) -> None:
    inp = _job(SEED1, 8, behaviour)
    f = data_pipeline_stall.check(inp, Features(inp))
    assert f is not None
    assert said in f.title, f.title
    assert advice in f.recommendation
    labels = {e.label for e in f.evidence}
    assert "host CPUs busy (node_exporter, mean over hosts)" in labels


def test_host_levels_raise_confidence_only_when_they_name_a_cause() -> None:
    plain = data_pipeline_stall.check(_job(SEED1, 8, None), Features(_job(SEED1, 8, None)))
    cpu_inp = _job(SEED1, 8, "cpu_bound_input")
    cpu = data_pipeline_stall.check(cpu_inp, Features(cpu_inp))
    sync_inp = _job(SEED1, 8, "host_sync")
    sync = data_pipeline_stall.check(sync_inp, Features(sync_inp))
    assert plain is not None and cpu is not None and sync is not None
    assert cpu.confidence > plain.confidence and sync.confidence == pytest.approx(plain.confidence)
    assert "CPU-bound" not in plain.title


@pytest.mark.parametrize(
    ("behaviour", "said"),
    [
        ("network_wait", "InfiniBand carries 80 GB/s per host: a network wait between nodes"),
        ("peer_wait", "InfiniBand is quiet between the 2 hosts: waiting for a peer, not the network"),
    ],
)
def test_a_communication_wait_on_two_hosts_reads_the_infiniband_traffic(behaviour: str, said: str) -> None:
    inp = _job(collective_at_sm(2.0, 0.5), 16, behaviour)
    f = communication_wait.check(inp, Features(inp))
    assert f is not None
    assert said in f.title, f.title
    ib = {e.label: e.value for e in f.evidence}["InfiniBand RX+TX per host"]
    assert ib == pytest.approx(80.0 if behaviour == "network_wait" else 0.4, rel=0.05)


def test_one_host_says_nothing_about_the_network() -> None:
    inp = _job(collective_at_sm(2.0, 0.5), 8, "network_wait")
    f = communication_wait.check(inp, Features(inp))
    assert f is not None and "InfiniBand" not in f.title


def test_the_look_averages_only_the_points_asked_for() -> None:
    inp = _job(SEED1, 8, "io_bound_input")
    feats = Features(inp)
    full = host_look(feats)
    mask = np.zeros(feats.timestamps.shape, dtype=bool)
    mask[10:20] = True
    part = host_look(feats, mask)
    assert full is not None and part is not None and part.hosts == full.hosts == 1
    assert part.iowait == pytest.approx(0.25, rel=0.05) and full.iowait == pytest.approx(0.25, rel=0.05)
