"""Reserved slot in the migration chain (filled by the work that needs it; empty is a no-op)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("jobs", "0012_ownership")]

    operations: list[migrations.operations.base.Operation] = []
