"""The weekly email preview in Chromium (issue 28 item 8): readable at 1,280 px (it was 3,330 px wide: the
text part's <pre> did not wrap and the HTML part's frame clipped the email), the whole HTML part shown."""

from __future__ import annotations

from datetime import timedelta

from jobs.models import Finding, GpuModel, Job, PriceEntry
from jobs.outputs.leaderboard import iso_week
from tests.browser.conftest import log_in

WIDE = {"width": 1280, "height": 900}


def test_the_email_preview_fits_1280_px_and_shows_the_whole_email(watched, live_server, member):
    from django.utils import timezone

    team = member.teams.get()
    week = iso_week(timezone.now().date()).previous()
    # $2.50/GPU-h on demand, the $480/day of 8 GPUs: the email prices each job's week from the dated book.
    gpu = GpuModel.objects.create(name="Preview test GPU")
    PriceEntry.objects.create(
        gpu_model=gpu, tier="on_demand", usd_per_gpu_hour=2.5, effective_from=week.start - timedelta(days=30)
    )
    for i, waste in enumerate((480.0, 240.0, 0.05)):
        job = Job.objects.create(
            team=team, external_id=f"mail-{i}", name=f"pretrain-{i}",
            started_at=week.start + timedelta(hours=1), ended_at=week.start + timedelta(hours=25),
            gpu_count=8, gpu_model=gpu, mfu=0.3, cost_per_day_usd=480.0,
            waste_per_day_usd=waste, waste_lower_bound_per_day_usd=waste, model_name="llama-7b",
        )  # fmt: skip
        Finding.objects.create(
            job=job, code="host_sync", severity="warning", confidence=0.8, waste_per_day_usd=waste / 2,
            title="The CPU waits on the GPU every step",
            recommendation="Remove the .item() and .cpu() calls from the training loop's hot path; " * 5,
        )  # fmt: skip
    log_in(watched, live_server.url, member.username)
    page = watched.page
    page.set_viewport_size(WIDE)
    page.goto(f"{live_server.url}/teams/{team.slug}/reports/{week.label}/")
    page.wait_for_load_state("load")
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDE["width"]
    text = page.locator("#email-text").inner_text()
    assert "1 more job wasted under $1.00 each: $0.05 in total." in text
    # The frame is as tall as the email it shows: nothing clipped, no scroll bar inside it.
    page.wait_for_function(
        "() => { const f = document.getElementById('email-html');"
        " return f.contentDocument && f.clientHeight >= f.contentDocument.documentElement.scrollHeight; }"
    )
    watched.shot("report-preview-1280")
    watched.assert_clean()
