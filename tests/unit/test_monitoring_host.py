"""A dstat log as the job's host signals where node_exporter has none (issue #24 item 2; no database).

The dstat files are tests/unit/data's, written in dstat 0.7.2 / 0.7.3's documented `--output` layout (no
real dstat log with a time column and a usable licence was found: tests/data/real/MANIFEST.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jobs.evaluation.monitoring_host import DSTAT_SOURCE, describe_dstat, dstat_signals, host_columns
from jobs.evaluation.monitoring_signals import merge
from jobs.metrics.signals import COUNT, MAX, MEAN, MIN, JobSignals, SignalSeries, grid
from jobs.profiling.dstat import analyze_dstat

DATA = Path(__file__).parent / "data"
T0 = 1715679000.0  # 14 May 2024 09:30:00 UTC, both files' "Date:" line


# dstat_0.7.3.csv by hand: `dstat -Tcmdn -D sda,sdb -N eth0 ... 5` on gpu-node-07; the first row (since boot)
# is dropped, leaving epochs T0+5.004, +10.004, +15.004. CPU busy = 1 - (idl + wai + stl) / 100:
# 1 - (58.25 + 2 + 0)/100 = 0.3975, 1 - (57 + 2.25)/100 = 0.4075, 1 - (59.25 + 2)/100 = 0.3875; iowait 0.02,
# 0.0225, 0.02. No dsk/total: read = sda + sdb = 0 each; write 524288 + 0, 0 + 4096, 262144 + 0 B/s. Network
# eth0 recv 5242880000, 5138022400, 5348392960 B/s; send 12582912, 12058624, 13107200 B/s. On a 5 s grid from
# T0 (windows (t - 5, t]) the samples close windows 2, 3 and 4.


def _analysis(name: str) -> dict:
    return analyze_dstat((DATA / name).read_bytes())


def test_dstat_columns_become_node_exporter_host_signals_in_their_units() -> None:
    ts = grid(T0, T0 + 20, 5.0)
    got, notes = dstat_signals([("dstat.csv", _analysis("dstat_0.7.3.csv"))], ts, 5.0, start=T0, end=T0 + 20)
    assert notes == [] and got.hosts == ("gpu-node-07",)
    busy = got.series["host_cpu_busy"].stats[MEAN]
    assert np.isnan(busy[:2]).all()
    assert busy[2:] == pytest.approx([0.3975, 0.4075, 0.3875])
    assert got.series["host_cpu_iowait"].stats[MEAN][2:] == pytest.approx([0.02, 0.0225, 0.02])
    assert got.series["host_disk_read_bytes"].stats[MEAN][2:] == pytest.approx([0.0, 0.0, 0.0])
    assert got.series["host_disk_write_bytes"].stats[MEAN][2:] == pytest.approx([524288.0, 4096.0, 262144.0])
    assert got.series["host_net_rx_bytes"].stats[MEAN][2:] == pytest.approx(
        [5242880000.0, 5138022400.0, 5348392960.0]
    )
    assert got.series["host_net_tx_bytes"].stats[MEAN][2:] == pytest.approx(
        [12582912.0, 12058624.0, 13107200.0]
    )
    assert got.series["host_cpu_busy"].unit == "ratio" and got.series["host_net_rx_bytes"].unit == "B/s"
    assert got.series["host_cpu_busy"].stats[COUNT][2] == 1.0  # one host
    assert "host_mem_available" not in got.series  # dstat's memory columns are not MemAvailable
    assert describe_dstat(got) == f"{DSTAT_SOURCE} 'dstat.csv' (host gpu-node-07, 5 s samples)"


# dstat_0.7.2.csv: `dstat -tcdngy ... 1 5`, the time column read in UTC (the Date: line says UTC), no
# steal column (older dstat): busy = 1 - (idl + wai)/100 = 1 - (48.75 + 22.5)/100 = 0.2875 at 09:30:01;
# disk read from dsk/total 104857600 B/s.


def test_an_older_dstat_without_steal_and_with_totals() -> None:
    cols = host_columns(_analysis("dstat_0.7.2.csv")["series"])
    assert cols["host_cpu_busy"][0] == pytest.approx(0.2875)
    assert cols["host_cpu_iowait"][0] == pytest.approx(0.225)
    assert cols["host_disk_read_bytes"][0] == pytest.approx(104857600.0)
    assert cols["host_net_rx_bytes"][0] == pytest.approx(1520.0)


def test_per_device_columns_leave_out_loopback_and_stacked_disks() -> None:
    series = {
        "t_unix_s": [1.0, 2.0],
        "net_lo_recv_bytes_per_s": [1e9, 1e9],
        "net_eth0_recv_bytes_per_s": [10.0, None],
        "net_ib0_recv_bytes_per_s": [5.0, 5.0],  # IPoIB: node_exporter counts IB by its port counters
        "dsk_dm_0_read_bytes_per_s": [7e6, 7e6],
        "dsk_nvme0n1_read_bytes_per_s": [3.0, 4.0],
    }
    cols = host_columns(series)
    assert cols["host_net_rx_bytes"][0] == 10.0 and np.isnan(cols["host_net_rx_bytes"][1])
    assert list(cols["host_disk_read_bytes"]) == [3.0, 4.0]
    assert "host_cpu_busy" not in cols


def test_two_hosts_are_aggregated_like_the_node_exporter_query() -> None:
    a = _analysis("dstat_0.7.3.csv")
    b = {**a, "host": "gpu-node-08"}
    ts = grid(T0, T0 + 20, 5.0)
    got, _ = dstat_signals([("a.csv", a), ("b.csv", b)], ts, 5.0, start=T0, end=T0 + 20)
    busy = got.series["host_cpu_busy"].stats
    assert busy[COUNT][2] == 2.0 and busy[MEAN][2] == pytest.approx(0.3975)
    assert busy[MIN][2] == busy[MAX][2] == pytest.approx(0.3975)
    # A second log of the same host: the newest (first) is used, the other is named.
    again, notes = dstat_signals([("new.csv", a), ("old.csv", a)], ts, 5.0, start=T0, end=T0 + 20)
    assert again.logs == ("new.csv",) and "a newer dstat log of host gpu-node-07" in notes[0]


def test_a_dstat_log_without_time_or_outside_the_job_is_not_used() -> None:
    a = _analysis("dstat_0.7.3.csv")
    ts = grid(T0, T0 + 20, 5.0)
    got, notes = dstat_signals(
        [("x.csv", {**a, "time_axis": "sample_index"})], ts, 5.0, start=T0, end=T0 + 20
    )
    assert not got.series and "no epoch or time column" in notes[0]
    later = grid(T0 + 3600, T0 + 3700, 5.0)
    got, notes = dstat_signals([("x.csv", a)], later, 5.0, start=T0 + 3600, end=T0 + 3700)
    assert not got.series and "outside the job's window" in notes[0]


def test_node_exporter_wins_where_it_has_samples_and_dstat_fills_the_rest() -> None:
    ts = grid(T0, T0 + 20, 5.0)
    got, _ = dstat_signals([("dstat.csv", _analysis("dstat_0.7.3.csv"))], ts, 5.0, start=T0, end=T0 + 20)
    # node_exporter has CPU busy 0.9 in windows 0-2 only.
    have = np.array([1.0, 1.0, 1.0, np.nan, np.nan])
    node = SignalSeries(
        "host_cpu_busy",
        "ratio",
        ts,
        {MEAN: np.where(np.isfinite(have), 0.9, np.nan), MIN: have * 0.9, MAX: have * 0.9, COUNT: have},
    )
    sigs = JobSignals(start=T0, end=T0 + 20, step=5.0, timestamps=ts, signals={"host_cpu_busy": node})
    text = describe_dstat(got)
    merged, sources = merge(sigs, [(text, got)], start=T0, end=T0 + 20, step=5.0, ts=ts)
    assert merged is not None
    busy = merged.signals["host_cpu_busy"].stats[MEAN]
    assert busy[2] == pytest.approx(0.9)  # both have window 2: node_exporter's
    assert busy[3:] == pytest.approx([0.4075, 0.3875])  # only dstat
    assert sources["host_cpu_busy"] == (
        f"node_exporter; 40% of the job's windows had no node_exporter sample and are {text}"
    )
    assert sources["host_cpu_iowait"] == text  # node_exporter had none: wholly from the log


def test_the_readers_take_stored_analyses_through_the_schema_and_survive_junk() -> None:
    from jobs.evaluation.monitoring_signals import log_signals
    from jobs.profiling.schema.monitoring import decode_dstat_log, decode_nvidia_smi_log

    ts = grid(T0, T0 + 20, 5.0)
    typed = decode_dstat_log(_analysis("dstat_0.7.3.csv"))
    assert typed.host == "gpu-node-07" and typed.median_interval_s == 5.0
    got, _ = dstat_signals([("d.csv", typed)], ts, 5.0, start=T0, end=T0 + 20)
    assert got.series["host_cpu_busy"].stats[MEAN][3] == pytest.approx(0.4075)
    junk = {"host": 7, "time_axis": "unix_s", "series": {"t_unix_s": "x", "cpu_idl_pct": [1, "2"]}}
    assert dstat_signals([("j.csv", junk)], ts, 5.0, start=T0, end=T0 + 20)[0].series == {}
    smi = {
        "time_axis": "unix_s",
        "gpu_assignment": {"method": "index column (GPU index)"},
        "gpus": ["not a gpu", {"gpu": "0", "median_interval_s": "fast"}],
        "series": {"0": {"t_unix_s": [T0 + 5, T0 + 10, "late"], "utilization_gpu_pct": [50, None, True]}},
    }
    (gpu,) = decode_nvidia_smi_log(smi).gpus  # the string entry is dropped, the bad interval unknown
    assert gpu.gpu == "0" and gpu.median_interval_s is None
    got_smi = log_signals(smi, ts, 5.0, start=T0, end=T0 + 20)
    # "late" and the boolean are dropped: 50 % at T0+5, no reading at T0+10.
    util = got_smi.series["gpu_util"]
    assert util.stats[MEAN][1] == pytest.approx(0.5) and np.isnan(util.stats[COUNT][2])
