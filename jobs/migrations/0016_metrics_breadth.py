"""Issue 25 (metrics truth and breadth): a job's kind may be "unknown" (the diagnosis then shows no cause
whose reading depends on the kind above info; jobs.diagnosis.kinds). Choices only: no data changes."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0015_artifact_provenance")]

    operations: list[migrations.operations.base.Operation] = [
        migrations.AlterField(
            model_name="job",
            name="kind",
            field=models.CharField(
                choices=[
                    ("training", "Training"),
                    ("fine_tuning", "Fine-tuning"),
                    ("inference", "Inference / serving"),
                    ("unknown", "Unknown"),
                ],
                default="training",
                help_text="training, fine_tuning, inference (serving) or unknown: changes the diagnosis' "
                "readings and advice.",
                max_length=16,
            ),
        ),
    ]
