"""nvidia-smi logs without a GPU column grouped into sweeps by evidence; time zones stated (issue 24.1)."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.profiling.dstat import analyze_dstat
from jobs.profiling.errors import ArtifactError
from jobs.profiling.nvidia_smi import analyze_nvidia_smi
from jobs.profiling.smi_sweeps import AmbiguousSweeps, assign_by_sweeps
from tests.conftest import sample_path
from tests.unit.test_monitoring import DATA

HEADER = "timestamp, power.draw [W], utilization.gpu [%], memory.used [MiB]\n"
START = datetime(2025, 3, 2, 14, 5, 31, 703000)


def _stamp(t: datetime) -> str:
    return t.strftime("%Y/%m/%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def _lms_log(busy: list[list[bool]], *, interval_ms: int = 100, query_ms: int = 5, cut: int = 0) -> bytes:
    """A `-lms interval_ms` log: sweep k, GPU g stamped when it was queried (query_ms apart inside a
    sweep, a deterministic 0-4 ms jitter per sweep), utilisation 97 % when busy else 0 %."""
    lines = [HEADER]
    sweeps = len(busy[0])
    for k in range(sweeps):
        base = START + timedelta(milliseconds=k * interval_ms + (k * 7) % 5)
        for g, gpu in enumerate(busy):
            when = base + timedelta(milliseconds=g * query_ms + (k + g) % 2)
            util = 97 if gpu[k] else 0
            lines.append(
                f"{_stamp(when)}, {250.5 + g if gpu[k] else 61.0:.2f} W, {util} %, {30000 + g} MiB\n"
            )
    text = "".join(lines)
    if cut:
        text = "".join(lines[:-cut])
    return text.encode()


def _pattern(sweeps: int, idle: int) -> list[bool]:
    """`idle` idle sweeps spread evenly over `sweeps` (True = busy)."""
    out = [True] * sweeps
    for i in range(idle):
        out[(i * sweeps) // idle] = False
    return out


def test_the_issues_two_gpu_lms_log_gives_each_gpu_its_own_samples() -> None:
    # Issue 24: 2 GPUs, 2,017 sweeps of `-lms 100`, each row with its own ms timestamp (GPU 1 ~5 ms after
    # GPU 0), both training, idle 41.5 % / 38.7 %. The old "n-th row of one timestamp" rule gave GPU 0
    # 3,998 samples and GPU 1 60 samples at 100 % idle. By construction: GPU 0 idle in 837 of 2,017
    # sweeps (41.50 %), GPU 1 in 781 (38.72 %).
    sweeps = 2017
    data = _lms_log([_pattern(sweeps, 837), _pattern(sweeps, 781)])
    result = analyze_nvidia_smi(data)
    json.dumps(result, allow_nan=False)
    assert result["gpu_count"] == 2
    assert [g["samples"] for g in result["gpus"]] == [2017, 2017]
    assert result["gpus"][0]["idle_share_pct"] == pytest.approx(100 * 837 / 2017, abs=1e-3)
    assert result["gpus"][1]["idle_share_pct"] == pytest.approx(100 * 781 / 2017, abs=1e-3)
    # Power follows its GPU: busy rows of GPU 1 read 251.5 W, never GPU 0's 250.5 W.
    assert result["gpus"][1]["stats"]["power_draw_w"]["max"] == 251.5
    assert result["gpus"][0]["stats"]["power_draw_w"]["max"] == 250.5
    assignment = result["gpu_assignment"]
    assert assignment["method"].startswith("sweeps by time gaps")
    assert assignment["sweeps"] == 2017 and assignment["unplaced_rows"] == 0
    assert assignment["short_gap_max_s"] < assignment["split_s"] < assignment["long_gap_min_s"]
    assert result["gpus"][0]["median_interval_s"] == pytest.approx(0.1, abs=0.005)


def test_eight_gpus_with_jitter_and_a_file_cut_mid_sweep() -> None:
    # 8 GPUs, 300 sweeps of -lms 200, 3 ms per GPU query; the last sweep lost its last 3 rows: GPUs 0-4
    # keep 300 samples, GPUs 5-7 299, within the ± few the check allows.
    busy = [[True] * 300 for _ in range(8)]
    result = analyze_nvidia_smi(_lms_log(busy, interval_ms=200, query_ms=3, cut=3))
    assert result["gpu_count"] == 8
    assert [g["samples"] for g in result["gpus"]] == [300] * 5 + [299] * 3
    assert result["gpu_assignment"]["truncated_last_sweep"] is True
    for g, gpu in enumerate(result["gpus"]):
        assert gpu["stats"]["memory_used_bytes"]["min"] == (30000 + g) * 1024**2  # every row on its GPU


def test_index_stripped_real_nanogpt_log_matches_its_own_index_column() -> None:
    # The real 8-GPU nanoGPT log (../shared/samples, MANIFEST: karpathy/nanoGPT PR #643, MIT) with its
    # gpu_index column removed: the sweep grouping must give every row the GPU its index said (639 sweeps
    # of 8 rows stamped with one time each; per-GPU mean power and idle share identical).
    path = sample_path("nvidia-smi/nanogpt_8gpu_util_power.csv")
    rows = list(csv.reader(path.open()))
    stripped = io.StringIO()
    writer = csv.writer(stripped)
    for row in rows:
        writer.writerow([row[0], *row[2:]])
    truth = analyze_nvidia_smi(path)
    got = analyze_nvidia_smi(stripped.getvalue().encode())
    assert got["gpu_assignment"]["gpu_count"] == 8 and got["gpu_assignment"]["sweeps"] == 639
    assert truth["gpu_assignment"]["method"] == "gpu_index column (GPU index)"
    for a, b in zip(truth["gpus"], got["gpus"], strict=True):
        assert b["samples"] == a["samples"] == 639
        assert b["stats"] == a["stats"]
        assert b["idle_share_pct"] == a["idle_share_pct"]


def test_an_index_column_that_cannot_be_a_gpu_id_is_not_trusted() -> None:
    # A logger wrote 0 in its "index" column on every row of the 2-GPU -lms log: one value while the
    # timestamps show sweeps of 2 rows, so the rows are grouped by sweep instead (as without the column).
    text = _lms_log([_pattern(100, 10), _pattern(100, 20)]).decode().splitlines()
    lines = ["timestamp, index, " + text[0].split(", ", 1)[1]]
    lines += [f"{row.split(', ', 1)[0]}, 0, {row.split(', ', 1)[1]}" for row in text[1:]]
    result = analyze_nvidia_smi(("\n".join(lines) + "\n").encode())
    assert result["gpu_count"] == 2
    assert [g["idle_share_pct"] for g in result["gpus"]] == [10.0, 20.0]
    assert result["gpu_assignment"]["method"].startswith("sweeps by time gaps")
    assert "index: one value on every row" in result["gpu_assignment"]["rejected_columns"][0]
    # With -l stamps (one time per sweep) the same column repeats within a timestamp: also rejected.
    same = "timestamp, index, utilization.gpu [%]\n" + "".join(
        f"2024/05/14 09:30:0{k}.000, 0, {u} %\n" for k in range(5) for u in (90, 0)
    )
    got = analyze_nvidia_smi(same.encode())
    assert got["gpu_count"] == 2 and got["gpus"][1]["idle_share_pct"] == 100.0
    assert "repeat a value within one timestamp" in got["gpu_assignment"]["rejected_columns"][0]


def test_rows_that_do_not_form_regular_sweeps_are_refused_with_add_index() -> None:
    # Sweeps of 2, 3, 2, 3, ... rows: no GPU count fits, so which row is which GPU is ambiguous.
    lines = [HEADER]
    for k in range(200):
        base = START + timedelta(milliseconds=100 * k)
        for g in range(2 + k % 2):
            lines.append(f"{_stamp(base + timedelta(milliseconds=4 * g))}, 100.00 W, 50 %, 10 MiB\n")
    with pytest.raises(ArtifactError, match=r"add `index`"):
        analyze_nvidia_smi("".join(lines).encode())


def test_a_gpu_whose_name_changes_between_sweeps_means_an_unstable_order() -> None:
    # Two different GPUs (as in a laptop + desktop log) whose rows swap order half-way: GPU 0 would get
    # both names, so the grouping is refused rather than mixing the two GPUs' readings.
    lines = ["timestamp, name, utilization.gpu [%]\n"]
    for k in range(40):
        base = START + timedelta(seconds=k)
        names = ["RTX 4090 Laptop", "RTX 4090"] if k < 20 else ["RTX 4090", "RTX 4090 Laptop"]
        for g, name in enumerate(names):
            lines.append(f"{_stamp(base + timedelta(milliseconds=4 * g))}, {name}, 10 %\n")
    with pytest.raises(ArtifactError, match="not stable"):
        analyze_nvidia_smi("".join(lines).encode())


def test_slow_queries_close_to_the_interval_still_form_sweeps() -> None:
    # 4 GPUs taking 40 ms each to query at -lms 100: 40 ms inside a sweep, 100 ms between (2.5x, below
    # the 3x of a clear split), but every sweep has 4 rows: 4 GPUs, 50 samples each.
    times = [k * 0.22 + g * 0.04 for k in range(50) for g in range(4)]
    sweeps = assign_by_sweeps(np.array(times))
    assert sweeps.gpu_count == 4 and sweeps.samples_per_gpu == [50] * 4
    # One GPU at 100 ms whose every 3rd-7th gap runs 170 ms: two-sided gaps, no regular sweeps: one GPU.
    jitter, t = [], 0.0
    for k in range(300):
        jitter.append(t)
        t += 0.17 if k % (3 + k % 5) == 0 else 0.1
    one = assign_by_sweeps(np.array(jitter))
    assert one.gpu_count == 1 and one.samples_per_gpu == [300]


def test_one_gpu_log_with_pauses_is_one_gpu() -> None:
    # A single GPU at -l 1 whose logger paused for 4 s twice (as in real -l 1 logs): the pauses are not
    # sweep boundaries of a many-GPU host.
    times = [float(i) for i in range(100)] + [104.0 + i for i in range(100)] + [208.0 + i for i in range(50)]
    sweeps = assign_by_sweeps(np.array(times))
    assert sweeps.gpu_count == 1 and sweeps.samples_per_gpu == [250]


def test_all_rows_at_one_time_are_one_sweep_and_a_crowd_of_them_is_ambiguous() -> None:
    assert assign_by_sweeps(np.zeros(4)).gpu_count == 4
    with pytest.raises(AmbiguousSweeps, match="same timestamp"):
        assign_by_sweeps(np.zeros(200))


def test_pci_bus_id_identifies_gpus_without_index() -> None:
    text = (
        "timestamp, pci.bus_id, utilization.gpu [%]\n"
        "2024/05/14 09:30:01.000, 00000000:07:00.0, 90 %\n"
        "2024/05/14 09:30:01.004, 00000000:0B:00.0, 0 %\n"
        "2024/05/14 09:30:02.000, 00000000:0B:00.0, 0 %\n"  # order swapped: the column decides
        "2024/05/14 09:30:02.004, 00000000:07:00.0, 80 %\n"
    )
    result = analyze_nvidia_smi(text.encode())
    assert result["gpu_assignment"]["method"] == "pci.bus_id column (PCI bus id)"
    by_id = {g["gpu"]: g for g in result["gpus"]}
    assert by_id["00000000:07:00.0"]["stats"]["utilization_gpu_pct"]["mean"] == 85
    assert by_id["00000000:0B:00.0"]["idle_share_pct"] == 100.0


def test_local_timestamps_say_utc_was_assumed() -> None:
    result = analyze_nvidia_smi(DATA / "nvidia_smi_units.csv")
    zone = result["time_zone"]
    assert zone["zone"] == "UTC" and zone["assumed"] is True
    assert "set `timezone` on upload" in zone["source"]
    assert zone["local_timestamps"] == result["samples"]


def test_an_iana_zone_reads_local_times_with_that_dates_offset() -> None:
    utc = analyze_nvidia_smi(DATA / "nvidia_smi_units.csv")
    berlin = analyze_nvidia_smi(DATA / "nvidia_smi_units.csv", timezone="Europe/Berlin")
    # 14 May 2024 is summer time in Berlin (CEST, UTC+2): 09:30 local is 07:30 UTC.
    assert utc["start_unix_s"] - berlin["start_unix_s"] == pytest.approx(7200)
    assert berlin["time_zone"]["zone"] == "Europe/Berlin" and berlin["time_zone"]["assumed"] is False
    assert berlin["time_zone"]["source"] == "given on upload"
    offset = analyze_nvidia_smi(DATA / "nvidia_smi_units.csv", timezone="-05:00")
    assert offset["start_unix_s"] - utc["start_unix_s"] == pytest.approx(5 * 3600)
    assert offset["time_zone"]["zone"] == "UTC-05:00"


def test_an_unknown_zone_is_refused_with_what_is_accepted() -> None:
    with pytest.raises(ArtifactError, match=r"unknown time zone 'Mars/Olympus'.*IANA"):
        analyze_nvidia_smi(DATA / "nvidia_smi_units.csv", timezone="Mars/Olympus")


def test_zoned_timestamps_need_no_assumption() -> None:
    result = analyze_nvidia_smi(sample_path("nvidia-smi/nanogpt_8gpu_util_power.csv"), timezone="Asia/Tokyo")
    # The file's own "Z" wins over any zone given: the start is 03:48:33.493 UTC either way.
    assert result["start_unix_s"] == pytest.approx(datetime(2025, 9, 24, 3, 48, 33, 493000, UTC).timestamp())
    assert result["time_zone"]["local_timestamps"] == 0 and result["time_zone"]["assumed"] is False
    assert result["time_zone"]["source"].startswith("not needed")


def test_dstat_epoch_column_needs_no_zone_and_time_column_reads_the_date_lines_zone() -> None:
    epoch = analyze_dstat(DATA / "dstat_0.7.3.csv", timezone="Asia/Tokyo")
    assert epoch["time_source"] == "epoch column (dstat -T)"
    assert epoch["start_unix_s"] == pytest.approx(1715679005.004)  # the zone changes nothing
    assert epoch["time_zone"]["local_timestamps"] == 0
    clock = analyze_dstat(DATA / "dstat_0.7.2.csv")
    assert clock["time_source"] == "time column (dstat -t)"
    # "Date:","14 May 2024 09:30:00 UTC": the Date line names UTC, so nothing is assumed.
    assert clock["time_zone"]["assumed"] is False and "Date:" in clock["time_zone"]["source"]
    shifted = analyze_dstat(DATA / "dstat_0.7.2.csv", timezone="+02:00")
    assert clock["start_unix_s"] - shifted["start_unix_s"] == pytest.approx(7200)


def test_dstat_time_column_with_an_ambiguous_abbreviation_states_the_assumption() -> None:
    text = (
        '"Dstat 0.7.3 CSV output"\n'
        '"Cmdline:","dstat -tc --output d.csv",,,,"Date:","31 Dec 2024 23:59:58 CST"\n'
        '"system","total cpu usage",,,\n"time","usr","sys","idl","wai"\n'
        "31-12 23:59:58,1,1,97,1\n31-12 23:59:59,50,5,40,5\n01-01 00:00:00,60,5,30,5\n"
    )
    result = analyze_dstat(text.encode())
    assert result["time_zone"]["assumed"] is True and "CST" in result["time_zone"]["source"]
    # The log crossed new year: 01-01 is in 2025, one second after 31-12 23:59:59 2024.
    series = result["series"]["t_unix_s"]
    assert series[1] - series[0] == pytest.approx(1.0)
    assert result["time_zone"]["year_wraps"] == 1


def test_the_command_line_takes_the_logs_time_zone(capsys: pytest.CaptureFixture[str]) -> None:
    from jobs.profiling.analyze import main

    path = str(DATA / "nvidia_smi_units.csv")
    assert main([path, "--json", "--timezone", "Europe/Berlin"]) == 0
    berlin = json.loads(capsys.readouterr().out)
    assert main([path, "--json"]) == 0
    utc = json.loads(capsys.readouterr().out)
    assert berlin["time_zone"]["zone"] == "Europe/Berlin" and utc["time_zone"]["assumed"] is True
    assert utc["start_unix_s"] - berlin["start_unix_s"] == pytest.approx(7200)  # CEST in May
    assert main([path, "--timezone", "Nowhere/Land"]) == 1
    assert "unknown time zone" in capsys.readouterr().err
