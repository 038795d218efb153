"""Split the GPU catalog's one clock into the peak's clock and the max boost clock; memory in MiB.

`boost_clock_mhz` served two purposes: the tensor cross-check needs the clock the dense peak assumes (H100
SXM 1830 MHz) and throttling needs the maximum boost clock (H100 SXM 1980 MHz), see reference/gpus.md,
"Clocks behind the peaks". The field is renamed to `peak_clock_mhz` (its seeded values were peak clocks)
and `max_clock_mhz` is added. `memory_gb` (decimal GB: 80 GB read as 76,294 MiB) becomes `memory_mib` as
the GPU reports it (H100 80GB: 81,559 MiB).

Rows are filled from the corrected catalog as it stands in this release (frozen below, not imported, so a
later catalog change cannot rewrite history). Values an admin changed from what 0002 seeded are kept.
Reversible: going back restores `boost_clock_mhz` from the peak clock and `memory_gb` (decimal GB) from
MiB; only the max clock, which did not exist before, is lost.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

MIB = 2**20

# name -> (peak clock MHz, max boost MHz, memory MiB) from jobs/evaluation/catalog.py of this release (sources there).
CORRECTED: dict[str, tuple[int | None, int | None, int | None]] = {
    "H100 SXM": (1830, 1980, 81559),
    "A100 SXM 40GB": (1410, 1410, 40960),
    "A100 SXM 80GB": (1410, 1410, 81920),
    "A100 PCIe 40GB": (1410, 1410, 40960),
    "A100 PCIe 80GB": (1410, 1410, 81920),
}
# What 0002 seeded into memory_gb (decimal GB); any other stored value is an admin's edit.
SEEDED_MEMORY_GB: dict[str, float] = {
    "H100 SXM": 80.0,
    "A100 SXM 40GB": 40.0,
    "A100 SXM 80GB": 80.0,
    "A100 PCIe 40GB": 40.0,
    "A100 PCIe 80GB": 80.0,
}


def _gb_to_mib(memory_gb: float | None) -> int | None:
    # The conversion the code applied before (decimal GB x 1e9 / 2**20): an admin's figure keeps the
    # capacity the diagnosis rules saw.
    return round(memory_gb * 1e9 / MIB) if memory_gb else None


def corrected_fields(name: str, peak_clock: int | None, memory_gb: float | None) -> dict[str, int | None]:
    """New clock and memory fields of one row, given its renamed clock and its old decimal-GB memory.

    A catalog row gets the corrected values unless an admin had changed them; a row the catalog does not
    know keeps its one clock as both clocks (as before, it was used for both) and its memory converted.
    """
    peak, max_clock, mib = CORRECTED.get(name, (None, None, None))
    if name in CORRECTED:
        # The seeded clock was already the peak's clock, so an existing value (seeded or edited) stays.
        new_peak = peak_clock if peak_clock is not None else peak
        edited_memory = memory_gb is not None and memory_gb != SEEDED_MEMORY_GB.get(name)
        new_mib = _gb_to_mib(memory_gb) if edited_memory else mib
        new_max = max_clock
    else:
        new_peak, new_max, new_mib = peak_clock, peak_clock, _gb_to_mib(memory_gb)
    return {"peak_clock_mhz": new_peak, "max_clock_mhz": new_max, "memory_mib": new_mib}


def restored_memory_gb(name: str, memory_mib: int | None) -> float | None:
    """Old decimal-GB figure for a row when migrating back (the seeded one where MiB is the catalog's)."""
    if memory_mib is None:
        return None
    if name in CORRECTED and memory_mib == CORRECTED[name][2]:
        return SEEDED_MEMORY_GB[name]
    return memory_mib * MIB / 1e9


def forwards(apps: Any, schema_editor: Any) -> None:
    GpuModel = apps.get_model("jobs", "GpuModel")
    for row in GpuModel.objects.all():
        for field, value in corrected_fields(row.name, row.peak_clock_mhz, row.memory_gb).items():
            setattr(row, field, value)
        row.save(update_fields=["peak_clock_mhz", "max_clock_mhz", "memory_mib"])


def backwards(apps: Any, schema_editor: Any) -> None:
    GpuModel = apps.get_model("jobs", "GpuModel")
    for row in GpuModel.objects.all():
        row.memory_gb = restored_memory_gb(row.name, row.memory_mib)
        row.save(update_fields=["memory_gb"])


class Migration(migrations.Migration):
    dependencies = [("jobs", "0003_job_indexes")]

    operations = [
        migrations.RenameField("gpumodel", "boost_clock_mhz", "peak_clock_mhz"),
        migrations.AlterField(
            model_name="gpumodel",
            name="peak_clock_mhz",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="SM clock the dense peaks assume (H100 SXM 1830); the MFU cross-check scales by it.",
                null=True,
                verbose_name="peak clock (MHz)",
            ),
        ),
        migrations.AddField(
            model_name="gpumodel",
            name="max_clock_mhz",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Maximum SM boost clock (H100 SXM 1980); throttling is judged against it.",
                null=True,
                verbose_name="max boost clock (MHz)",
            ),
        ),
        migrations.AddField(
            model_name="gpumodel",
            name="memory_mib",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Capacity as the GPU reports it (nvidia-smi memory.total), e.g. 81559 for H100 80GB.",
                null=True,
                verbose_name="memory (MiB)",
            ),
        ),
        migrations.RunPython(forwards, backwards),
        migrations.RemoveField(model_name="gpumodel", name="memory_gb"),
    ]
