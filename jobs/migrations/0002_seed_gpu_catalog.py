"""Seed the GPU catalog and the price book (see jobs.demo.seed); only adds what is missing."""

from django.db import migrations


def seed(apps, schema_editor):
    from jobs.demo.seed import seed_catalog

    seed_catalog(apps.get_model("jobs", "GpuModel"), apps.get_model("jobs", "PriceEntry"))


class Migration(migrations.Migration):
    dependencies = [("jobs", "0001_initial")]
    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
