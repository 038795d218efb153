"""Seed the GPU catalog and the price book from jobs.catalog (reference/gpus.md).

Only adds what is missing, so re-running never overwrites an admin's edits.
"""

from datetime import UTC, datetime

from django.db import migrations


def seed(apps, schema_editor):
    from jobs.catalog import GPU_SPECS, PRICE_SEEDS

    GpuModel = apps.get_model("jobs", "GpuModel")
    PriceEntry = apps.get_model("jobs", "PriceEntry")
    by_name = {}
    for spec in GPU_SPECS:
        fields = spec.to_dict()
        name = fields.pop("name")
        gpu, _ = GpuModel.objects.get_or_create(name=name, defaults=fields)
        by_name[name] = gpu
    for price in PRICE_SEEDS:
        start = datetime.combine(price.effective_from, datetime.min.time(), tzinfo=UTC)
        PriceEntry.objects.get_or_create(
            gpu_model=by_name[price.gpu],
            tier=price.tier,
            effective_from=start,
            defaults={"usd_per_gpu_hour": price.usd_per_gpu_hour, "source": price.source},
        )


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
