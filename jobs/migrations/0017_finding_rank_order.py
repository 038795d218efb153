"""Findings ordered by jobs.models.jobs.FINDING_RANK_ORDER (specific causes before the unexplained remainder,
then $/day, severity, confidence): ordering only, no schema change."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0016_metrics_breadth")]

    operations = [
        migrations.AlterModelOptions(
            name="finding",
            options={
                "ordering": [
                    models.Case(
                        models.When(code="unexplained_waste", then=models.Value(1)), default=models.Value(0)
                    ).asc(),
                    models.F("waste_per_day_usd").desc(nulls_last=True),
                    models.Case(
                        models.When(severity="critical", then=models.Value(2)),
                        models.When(severity="warning", then=models.Value(1)),
                        default=models.Value(0),
                    ).desc(),
                    models.F("confidence").desc(),
                    models.F("code").asc(),
                ]
            },
        ),
    ]
