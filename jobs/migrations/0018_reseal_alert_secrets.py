"""Webhook URLs and secrets sealed as Fernet tokens (jobs.alerts.secrets): every value stored in the earlier
home-made format ("v1:") is opened and sealed again; a value no key opens is left as it is."""

from django.db import migrations


def reseal(apps, schema_editor):
    from jobs.alerts import secrets

    Subscription = apps.get_model("jobs", "AlertSubscription")
    for sub in Subscription.objects.exclude(url_encrypted="", secret_encrypted="").iterator():
        url, secret = secrets.reseal(sub.url_encrypted), secrets.reseal(sub.secret_encrypted)
        if (url, secret) != (sub.url_encrypted, sub.secret_encrypted):
            Subscription.objects.filter(pk=sub.pk).update(url_encrypted=url, secret_encrypted=secret)


class Migration(migrations.Migration):
    dependencies = [("jobs", "0017_finding_rank_order")]

    operations = [migrations.RunPython(reseal, migrations.RunPython.noop)]
