import os
from pathlib import Path
import pytest
from django.contrib.auth import get_user_model
from jobs.models import Job, Finding
from jobs.reports import build_report, render_report
from tests.test_reports import scenario, week, make_job  # noqa
from datetime import timedelta

@pytest.mark.django_db
@pytest.mark.urls("tests.urls_reports")
def test_dump(client, week, settings):
    settings.SITE_URL = "https://eff.example.com"
    teams = scenario(week)
    llm = teams["llm"]
    for i in range(3):
        make_job(llm, f"30{i}", week.start + timedelta(hours=1), 10, waste_per_day_usd=float(24 * (i + 1)), name=f"finetune-{i} <b>x</b>")
    Job.objects.filter(external_id="101").update(name="<script>alert(1)</script>")
    _, text, html = render_report(build_report(llm, week))
    Path("/tmp/email.html").write_text(html)
    Path("/tmp/email.txt").write_text(text)
    client.force_login(get_user_model().objects.get(username="alice"))
    body = client.get(f"/teams/llm/reports/{week.label}/").content.decode()
    from efficiency.middleware import CONTENT_SECURITY_POLICY
    csp = CONTENT_SECURITY_POLICY.replace("; frame-ancestors 'none'", "")
    body = body.replace("<head>", f'<head><meta http-equiv="Content-Security-Policy" content="{csp}">', 1)
    Path("/tmp/preview.html").write_text(body)
