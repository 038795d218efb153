"""Weekly cost-waste email: numbers equal the leaderboard, recipients, exactly-once delivery over real SMTP,
the management command and the preview page."""

from __future__ import annotations

import email
import email.policy
import logging
import re
import socket
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from jobs.models import Finding, GpuModel, Job, Membership, PriceEntry, ReportDelivery, Team
from jobs.outputs import report_content, report_render, reports
from jobs.outputs.leaderboard import Period, iso_week, team_rows
from jobs.outputs.report_content import build_report
from jobs.outputs.report_render import render_report
from jobs.outputs.reports import Outcome, send_team_report, send_weekly_reports
from jobs.templatetags import units

LOCMEM = "django.core.mail.backends.locmem.EmailBackend"
SMTP = "django.core.mail.backends.smtp.EmailBackend"
SITE = "https://eff.example.com"


# --------------------------------------------------------------------------------------------- helpers


@dataclass
class SmtpHandler:
    """aiosmtpd handler keeping what it accepted; refuses the next `fail_next` messages with a 451."""

    messages: list[tuple[str, list[str], bytes]] = field(default_factory=list)
    fail_next: int = 0

    async def handle_DATA(self, server, session, envelope) -> str:
        if self.fail_next > 0:
            self.fail_next -= 1
            return "451 4.3.0 Temporary failure, try again later"
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
        return "250 Message accepted for delivery"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def smtp(settings):
    """A real SMTP server on a free loopback port, with Django's SMTP backend pointed at it."""
    from aiosmtpd.controller import Controller

    # aiosmtpd's server thread logs each session at INFO, sometimes after pytest closed the captured stream.
    mail_log = logging.getLogger("mail.log")
    level = mail_log.level
    mail_log.setLevel(logging.WARNING)
    handler = SmtpHandler()
    controller = Controller(handler, hostname="127.0.0.1", port=_free_port())
    controller.start()
    settings.EMAIL_BACKEND = SMTP
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = controller.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_TIMEOUT = 10
    settings.DEFAULT_FROM_EMAIL = "efficiency <efficiency@localhost>"
    try:
        yield handler
    finally:
        controller.stop()
        mail_log.setLevel(level)


@pytest.fixture
def locmem(settings):
    settings.EMAIL_BACKEND = LOCMEM
    mail.outbox = []
    return mail.outbox


@pytest.fixture(autouse=True)
def _site(settings):
    settings.SITE_URL = SITE


@pytest.fixture
def week() -> Period:
    """A finished week (two weeks ago), so no job is cut at 'now'."""
    return iso_week(timezone.now().date() - timedelta(days=14))


def _gpu() -> GpuModel:
    """A GPU model at $2.50/GPU-h on demand: the period totals price each job from its dated book
    (jobs.evaluation.totals.cost_inside), so the jobs' stored rates below are GPUs x $2.50 x 24 to agree."""
    gpu, created = GpuModel.objects.get_or_create(name="Report test GPU")
    if created:
        PriceEntry.objects.create(
            gpu_model=gpu,
            tier="on_demand",
            usd_per_gpu_hour=2.5,
            effective_from=datetime(2020, 1, 1, tzinfo=UTC),
        )
    return gpu


def make_job(team: Team, external_id: str, start: datetime, hours: float | None, **fields) -> Job:
    values = {
        "gpu_count": 8,
        "gpu_model": _gpu(),
        "mfu": 0.3,
        "cost_per_day_usd": fields.get("gpu_count", 8) * 2.5 * 24,
        "waste_per_day_usd": 100.0,
        "model_name": "llama-7b",
        "name": f"job-{external_id}",
        **fields,
    }
    # A known total is its own lower bound (what ingestion stores); tests of unknown waste pass their own.
    values.setdefault("waste_lower_bound_per_day_usd", values["waste_per_day_usd"])
    end = start + timedelta(hours=hours) if hours is not None else None
    return Job.objects.create(team=team, external_id=external_id, started_at=start, ended_at=end, **values)


def add_member(team: Team, username: str, email_addr: str, *, opted_in: bool = True, active: bool = True):
    user = get_user_model().objects.create_user(username=username, email=email_addr, is_active=active)
    Membership.objects.create(team=team, user=user, weekly_report=opted_in)
    return user


def scenario(week: Period) -> dict[str, object]:
    """Team llm with jobs across both week boundaries, members with every recipient case, and a rival team."""
    llm = Team.objects.create(
        slug="llm",
        name="LLM",
        extra_report_recipients=["lead@partner.example", "ALICE@example.com"],  # the second is a duplicate
    )
    vision = Team.objects.create(slug="vision", name="Vision")
    add_member(llm, "alice", "alice@example.com")
    add_member(llm, "bob", "bob@example.com", opted_in=False)
    add_member(llm, "carol", "")
    add_member(llm, "dave", "dave@example.com", active=False)
    start, end = week.start, week.end
    # 12 h of this job fall in the previous week, 36 h in this one.
    spanning = make_job(llm, "101", start - timedelta(hours=12), 48, mfu=0.25, waste_per_day_usd=288.0)
    make_job(llm, "102", start + timedelta(days=2), 24, gpu_count=16, mfu=0.41, cost_per_day_usd=960.0)
    # Runs into the next week: 6 h count here; no MFU yet, so it is left out of the weighted MFU.
    # Its waste is unknown; only its idle part ($24/day) is known, so the team's week is "at least".
    make_job(
        llm, "103", end - timedelta(hours=6), 30, gpu_count=4, mfu=None, waste_per_day_usd=None,
        waste_lower_bound_per_day_usd=24.0, waste_unknown_reason="MFU unknown (no throughput)",
    )  # fmt: skip
    make_job(llm, "104", start - timedelta(days=3), 10, waste_per_day_usd=50.0)  # previous week only
    make_job(vision, "201", start + timedelta(days=1), 20, mfu=0.55, waste_per_day_usd=10.0)
    Finding.objects.create(
        job=spanning,
        code="dataloader_stall",
        severity="critical",
        confidence=0.9,
        title="Input pipeline stalls 30 % of steps",
        recommendation="Raise num_workers to 8 and enable pin_memory.",
        waste_per_day_usd=120.0,
    )
    Finding.objects.create(
        job=spanning,
        code="small_micro_batch",
        severity="warning",
        confidence=0.6,
        title="Micro-batch too small",
        recommendation="Double the micro-batch.",
        waste_per_day_usd=40.0,
    )
    return {"llm": llm, "vision": vision}


def _row(period: Period, team: Team):
    return next(r for r in team_rows(period) if r.team_id == team.pk)


def _parts(raw: bytes) -> tuple[email.message.EmailMessage, str, str]:
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    assert msg.get_content_type() == "multipart/alternative"
    text = msg.get_body(preferencelist=("plain",)).get_content()
    html = msg.get_body(preferencelist=("html",)).get_content()
    return msg, text, html


# --------------------------------------------------------------------------------------------- numbers


@pytest.mark.django_db
def test_report_numbers_equal_the_leaderboard_across_week_boundaries(week):
    teams = scenario(week)
    llm = teams["llm"]
    report = build_report(llm, week)
    row, prev = _row(week, llm), _row(week.previous(), llm)

    assert report.gpu_hours == row.gpu_hours == pytest.approx(36 * 8 + 24 * 16 + 6 * 4)
    assert report.cost_usd == row.cost_usd
    # Waste inside the week: 101 $288/day × 36 h + 102 $100/day × 24 h, known; 103 has only its idle part,
    # $24/day × 6 h. So the week's waste is unknown and at least 432 + 100 + 6 = $538.
    assert report.waste_usd is None and row.waste_usd is None
    assert report.waste == row.waste
    assert row.waste_lower_bound_usd == pytest.approx(288 / 24 * 36 + 100 + 24 / 24 * 6)
    assert row.waste_unknown_reason == "waste unknown for 1 of 3 jobs: MFU unknown for 1"
    assert report.weighted_mfu == row.weighted_mfu == pytest.approx((0.25 * 288 + 0.41 * 384) / (288 + 384))
    # Last week is known (101's 12 h and 104's 10 h): 288/24 × 12 + 50/24 × 10.
    assert prev.waste_usd == pytest.approx(144 + 50 / 24 * 10)
    # A change against a lower bound is not a change: unknown, not a number.
    assert report.waste_change_usd is None
    assert prev.gpu_hours == pytest.approx(12 * 8 + 10 * 8)
    # Vision's MFU is higher: llm is second of two, as the leaderboard ranks them.
    assert [r.team_slug for r in team_rows(week)] == ["vision", "llm"]
    assert (report.rank, report.teams_ranked) == (2, 2)

    subject, text, html = render_report(report)
    for shown in (
        units.usd(row.cost_usd),
        f"at least {units.usd(row.waste_lower_bound_usd)}",
        "waste unknown for 1 of 3 jobs: MFU unknown for 1",
        units.pct(row.weighted_mfu),
        f"{units.num(row.gpu_hours, 1)} GPU-h",
        "#2 of 2 teams",
    ):
        assert shown in text, shown
        assert shown in html, shown
    assert f"at least {units.usd(row.waste_lower_bound_usd)} wasted" in subject and week.label in subject
    assert "On-demand" in text  # the price tier behind the cost is named


@pytest.mark.django_db
def test_top_five_jobs_with_their_main_finding_and_absolute_links(week):
    teams = scenario(week)
    llm = teams["llm"]
    for i in range(5):
        make_job(llm, f"30{i}", week.start + timedelta(hours=1), 10, waste_per_day_usd=float(24 * (i + 1)))
    report = build_report(llm, week)

    assert len(report.top_jobs) == report_content.TOP_JOBS == 5
    wastes = [j.waste_usd for j in report.top_jobs]
    assert wastes == sorted(wastes, reverse=True)
    top = report.top_jobs[0]
    assert top.external_id == "101"  # 288 $/day for 36 h = $432, the most
    assert top.waste_usd == pytest.approx(288 / 24 * 36)
    assert top.finding_title == "Input pipeline stalls 30 % of steps"  # the higher-$ finding of the two
    assert top.finding_recommendation.startswith("Raise num_workers")
    assert top.url == f"{SITE}/jobs/101/"
    assert top.bar_pct == 100
    _, text, html = render_report(report)
    assert f"{SITE}/jobs/101/" in text and f'href="{SITE}/jobs/101/"' in html
    assert "Fix: Raise num_workers to 8" in text


@pytest.mark.django_db
def test_jobs_under_a_dollar_are_summed_in_one_line_and_the_text_part_wraps(week):
    """The issue's email listed a $0.05 job as a top wasting job, and its text part ran 3,330 px wide."""
    llm = Team.objects.create(slug="llm", name="LLM")
    add_member(llm, "alice", "alice@example.com")
    make_job(llm, "big", week.start + timedelta(hours=1), 24, waste_per_day_usd=100.0)  # $100 in the week
    # 0.05 $/day for 24 h = $0.05, and 0.02 $/day = $0.02: under MIN_LISTED_WASTE_USD ($1).
    make_job(llm, "tiny", week.start + timedelta(hours=1), 24, waste_per_day_usd=0.05)
    make_job(llm, "tinier", week.start + timedelta(hours=1), 24, waste_per_day_usd=0.02)
    Finding.objects.create(
        job=Job.objects.get(external_id="big"), code="host_sync", severity="warning", confidence=0.8,
        title="The CPU waits on the GPU every step", waste_per_day_usd=60.0,
        recommendation="Remove the .item() call in the training loop " * 6,
    )  # fmt: skip
    report = build_report(llm, week)
    assert [j.external_id for j in report.top_jobs] == ["big"]
    assert report.small_jobs == 2 and report.small_jobs_waste_usd == pytest.approx(0.07)
    _, text, html = render_report(report)
    assert "2 more jobs wasted under $1.00 each: $0.07 in total." in text
    assert "2 more jobs wasted under $1.00 each: $0.07 in total." in html
    assert "tiny" not in text
    for line in text.splitlines():
        # Only a single word longer than the width (a URL) may exceed it, alone on its line.
        assert len(line) <= report_render.TEXT_WIDTH or " " not in line.strip(), line
    assert "Remove the .item() call in the training loop Remove" in text.replace("\n      ", " ")


def test_wrap_text_keeps_list_indents_and_whole_urls():
    url = "https://efficiency.example.com/jobs/" + "x" * 80 + "/"
    wrapped = report_render.wrap_text("- " + "word " * 30 + "\n   " + url, width=40)
    lines = wrapped.splitlines()
    assert all(len(line) <= 40 for line in lines[:-1])
    assert lines[1].startswith("  word") and lines[-1] == "   " + url


@pytest.mark.django_db
def test_recipients_respect_opt_out_and_include_extra_addresses(week):
    llm = scenario(week)["llm"]
    # bob opted out, carol has no address, dave is inactive; ALICE@ in the extras is alice again.
    assert report_content.report_recipients(llm) == ["alice@example.com", "lead@partner.example"]


@pytest.mark.django_db
def test_html_part_escapes_user_text_and_has_no_external_assets(week):
    llm = scenario(week)["llm"]
    Job.objects.filter(external_id="101").update(name="<script>alert(1)</script>")
    _, text, html = render_report(build_report(llm, week))
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)</script>" in text  # the text part is plain text: shown as typed
    for external in ("<link", "<img", "<script", "src=", "<style"):
        assert external not in html


@pytest.mark.django_db
def test_default_period_is_last_week_in_the_configured_time_zone(settings):
    now = datetime(2026, 11, 23, 0, 30, tzinfo=UTC)  # Monday of W48 in UTC, still Sunday in California
    settings.TIME_ZONE = "UTC"
    assert reports.default_period(now).label == "2026-W47"
    settings.TIME_ZONE = "America/Los_Angeles"
    assert reports.default_period(now).label == "2026-W46"


# --------------------------------------------------------------------------------------------- delivery


@pytest.mark.django_db
def test_sends_once_over_real_smtp_with_text_and_html_parts(week, smtp):
    llm = scenario(week)["llm"]
    outcome = send_team_report(llm, week)
    assert outcome.status == Outcome.SENT, outcome.error

    assert len(smtp.messages) == 1
    mail_from, rcpt_tos, raw = smtp.messages[0]
    assert mail_from == "efficiency@localhost"
    assert sorted(rcpt_tos) == ["alice@example.com", "lead@partner.example"]
    msg, text, html = _parts(raw)
    row = _row(week, llm)
    assert msg["Subject"] == outcome.subject
    assert week.label in msg["Subject"]
    assert "bob@example.com" not in msg["To"]
    for shown in (units.usd(row.cost_usd), units.usd(row.waste_lower_bound_usd), units.pct(row.weighted_mfu)):
        assert shown in text and shown in html
    assert f"{SITE}/jobs/101/" in text

    delivery = ReportDelivery.objects.get(team=llm, week_start=week.start.date())
    assert delivery.status == ReportDelivery.Status.SENT
    assert delivery.attempts == 1
    assert delivery.message_id == msg["Message-ID"].strip() == outcome.message_id
    assert delivery.sent_at is not None and delivery.error == ""
    assert sorted(delivery.recipients) == sorted(rcpt_tos)

    again = send_team_report(llm, week)
    assert again.status == Outcome.ALREADY_SENT
    assert len(smtp.messages) == 1


@pytest.mark.django_db
def test_retry_after_smtp_rejection_sends_exactly_once(week, smtp):
    llm = scenario(week)["llm"]
    smtp.fail_next = 1
    first = send_team_report(llm, week)
    assert first.status == Outcome.FAILED
    assert "451" in first.error
    delivery = ReportDelivery.objects.get(team=llm)
    assert (delivery.status, delivery.attempts) == (ReportDelivery.Status.FAILED, 1)
    assert "451" in delivery.error
    assert smtp.messages == []

    assert send_team_report(llm, week).status == Outcome.SENT
    assert send_team_report(llm, week).status == Outcome.ALREADY_SENT
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.error) == (ReportDelivery.Status.SENT, 2, "")
    assert len(smtp.messages) == 1


@pytest.mark.django_db
def test_unreachable_smtp_server_fails_then_retry_sends(week, smtp, settings):
    llm = scenario(week)["llm"]
    port = settings.EMAIL_PORT
    settings.EMAIL_PORT = _free_port()  # nothing listens there
    outcomes = send_weekly_reports(week)
    failed = {o.team_slug: o for o in outcomes}["llm"]
    assert failed.status == Outcome.FAILED
    assert "Connection" in failed.error or "refused" in failed.error.lower()

    settings.EMAIL_PORT = port
    statuses = {o.team_slug: o.status for o in send_weekly_reports(week)}
    assert statuses == {"llm": Outcome.SENT, "vision": Outcome.NO_RECIPIENTS}
    assert ReportDelivery.objects.get(team=llm).attempts == 2
    assert len(smtp.messages) == 1


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_senders_send_once(week, smtp, monkeypatch):
    scenario(week)
    Team.objects.filter(slug="vision").update(extra_report_recipients=["vision-lead@example.com"])
    real_claim = reports._claim
    barrier = threading.Barrier(2)

    def racing_claim(*args, **kwargs):
        # Both beats reach the claim together: the database, not timing luck, must pick one.
        barrier.wait(timeout=20)
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(reports, "_claim", racing_claim)
    results: list[list[reports.DeliveryOutcome]] = []
    errors: list[BaseException] = []

    def beat() -> None:
        try:
            results.append(send_weekly_reports(week))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=beat) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    by_team: dict[str, list[Outcome]] = {}
    for outcome in (o for run in results for o in run):
        by_team.setdefault(outcome.team_slug, []).append(outcome.status)
    for slug, statuses in by_team.items():
        assert statuses.count(Outcome.SENT) == 1, (slug, statuses)
        assert set(statuses) - {Outcome.SENT} <= {Outcome.ALREADY_SENT, Outcome.IN_PROGRESS}
    assert sorted(rcpt[0] for _, rcpt, _ in smtp.messages) == ["alice@example.com", "vision-lead@example.com"]
    assert ReportDelivery.objects.filter(status=ReportDelivery.Status.SENT, attempts=1).count() == 2


@pytest.mark.django_db
def test_stale_claim_is_resent_and_a_fresh_one_is_not(week, locmem):
    llm = scenario(week)["llm"]
    delivery = ReportDelivery.objects.create(
        team=llm,
        week_start=week.start.date(),
        status=ReportDelivery.Status.CLAIMED,
        claimed_at=timezone.now() - timedelta(minutes=1),
        claim_token="worker-that-is-still-sending",
        attempts=1,
    )
    assert send_team_report(llm, week).status == Outcome.IN_PROGRESS
    assert locmem == []
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (ReportDelivery.Status.CLAIMED, 1)

    # The worker died: once its claim is older than the timeout, the week is sent (late, not lost).
    delivery.claimed_at = timezone.now() - reports.STALE_CLAIM_TIMEOUT - timedelta(seconds=5)
    delivery.save()
    assert send_team_report(llm, week).status == Outcome.SENT
    assert len(locmem) == 1
    assert sorted(locmem[0].to) == ["alice@example.com", "lead@partner.example"]
    assert [a[1] for a in locmem[0].alternatives] == ["text/html"]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == (ReportDelivery.Status.SENT, 2)
    assert delivery.claim_token != "worker-that-is-still-sending"


@pytest.mark.django_db
def test_dry_run_sends_nothing_and_records_nothing(week, locmem):
    llm = scenario(week)["llm"]
    outcome = send_team_report(llm, week, dry_run=True)
    assert outcome.status == Outcome.DRY_RUN
    assert outcome.recipients == ("alice@example.com", "lead@partner.example")
    assert units.usd(_row(week, llm).waste_lower_bound_usd) in outcome.text
    assert locmem == []
    assert not ReportDelivery.objects.exists()


@pytest.mark.django_db
def test_team_without_gpu_hours_gets_no_email_and_no_row(week, locmem):
    idle = Team.objects.create(slug="idle", name="Idle", extra_report_recipients=["x@example.com"])
    outcome = send_team_report(idle, week)
    assert outcome.status == Outcome.NO_ACTIVITY
    assert locmem == [] and not ReportDelivery.objects.exists()
    subject, text, _ = render_report(build_report(idle, week))  # the preview still renders
    assert "no GPU hours" in subject and "No GPU hours" in text


# --------------------------------------------------------------------------------------------- command


@pytest.mark.django_db
def test_command_dry_run_send_and_skip_output(week, locmem):
    scenario(week)
    Team.objects.create(slug="idle", name="Idle", extra_report_recipients=["x@example.com"])
    out = StringIO()
    call_command("send_weekly_reports", "--week", week.label, "--team", "llm", "--dry-run", stdout=out)
    printed = out.getvalue()
    assert f"llm {week.label}: dry run, would send to 2 recipient(s)" in printed
    assert f"Subject: LLM {week.label}: " in printed
    assert "To: alice@example.com, lead@partner.example" in printed
    assert "TOP WASTING JOBS" in printed
    assert locmem == [] and not ReportDelivery.objects.exists()

    out = StringIO()
    call_command("send_weekly_reports", "--week", week.label, stdout=out)
    printed = out.getvalue()
    assert f"llm {week.label}: sent to 2 recipient(s) (attempt 1, <" in printed
    assert f"idle {week.label}: skipped (no GPU hours in {week.label})" in printed
    assert f"vision {week.label}: skipped (no recipients" in printed
    assert len(locmem) == 1

    out = StringIO()
    call_command("send_weekly_reports", "--week", week.label, "--team", "llm", stdout=out)
    assert f"llm {week.label}: skipped (already sent)" in out.getvalue()
    assert len(locmem) == 1


@pytest.mark.django_db
def test_command_reports_failure_with_reason_and_nonzero_exit(week, smtp, settings):
    scenario(week)
    smtp.fail_next = 1
    out = StringIO()
    with pytest.raises(CommandError, match="1 of 1 report"):
        call_command("send_weekly_reports", "--week", week.label, "--team", "llm", stdout=out)
    assert f"llm {week.label}: failed (attempt 1): SMTPDataError" in out.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["2026-47", "2026-W54", "last week", "2026-W"])
def test_command_rejects_a_bad_week(bad):
    with pytest.raises(CommandError, match="is not an ISO week like 2026-W47"):
        call_command("send_weekly_reports", "--week", bad, stdout=StringIO())


@pytest.mark.django_db
def test_command_rejects_an_unknown_team(week):
    with pytest.raises(CommandError, match="no team with slug 'nope'"):
        call_command("send_weekly_reports", "--week", week.label, "--team", "nope", stdout=StringIO())


# --------------------------------------------------------------------------------------------- preview


@pytest.mark.django_db
def test_preview_page_renders_and_escapes_user_text(client, week, tmp_path):
    llm = scenario(week)["llm"]
    Job.objects.filter(external_id="101").update(name="<script>alert(1)</script>")
    Finding.objects.filter(code="dataloader_stall").update(title='<img src=x onerror="alert(2)">')
    ReportDelivery.objects.create(
        team=llm, week_start=week.previous().start.date(), status="failed", attempts=3, error="SMTP <down>"
    )
    client.force_login(get_user_model().objects.get(username="alice"))
    response = client.get(f"/teams/llm/reports/{week.label}/")
    assert response.status_code == 200
    body = response.content.decode()
    # Neither the job name nor any inline script: the only script is the page's own static file.
    assert re.findall(r"<script\b[^>]*>", body) == [
        m for m in re.findall(r"<script\b[^>]*>", body) if re.search(r'src="/static/js/[\w.]+\.js"', m)
    ]
    assert "<img" not in body
    # The email's frame runs no script (no allow-scripts); same-origin only so the page can size it.
    assert "<iframe" in body and 'sandbox="allow-same-origin"' in body and "allow-scripts" not in body
    # Escaped twice in srcdoc (the email escapes it, then the attribute does), once in the text part.
    assert "&amp;lt;script&amp;gt;alert(1)&amp;lt;/script&amp;gt;" in body
    assert '<pre id="email-text">' in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "alice@example.com, lead@partner.example" in body  # a member sees the addresses
    assert "SMTP &lt;down&gt;" in body  # the delivery history, escaped
    assert "Not sent yet." in body


@pytest.mark.django_db
def test_preview_hides_addresses_from_outsiders_and_404s_a_bad_week(client, week):
    scenario(week)
    outsider = get_user_model().objects.create_user(username="eve", email="eve@example.com")
    client.force_login(outsider)
    body = client.get(f"/teams/llm/reports/{week.label}/").content.decode()
    assert "alice@example.com" not in body and "2 address(es)" in body
    assert client.get("/teams/llm/reports/2026-47/").status_code == 404
    assert client.get(f"/teams/nope/reports/{week.label}/").status_code == 404


@pytest.mark.django_db
def test_the_weekly_task_retries_the_same_week_after_an_smtp_failure(settings, monkeypatch):
    from celery.exceptions import Retry

    from jobs import tasks
    from jobs.outputs import reports

    failed = reports.DeliveryOutcome(team_slug="llm", week="2026-W47", status=reports.Outcome.FAILED)
    seen = []
    monkeypatch.setattr(reports, "send_weekly_reports", lambda period: seen.append(period.label) or [failed])
    with pytest.raises(Retry):
        tasks.send_weekly_reports.apply(kwargs={"week": "2026-W47"}, throw=True)
    assert seen == ["2026-W47"]
    ok = reports.DeliveryOutcome(team_slug="llm", week="2026-W47", status=reports.Outcome.SENT)
    monkeypatch.setattr(reports, "send_weekly_reports", lambda period: [ok])
    assert tasks.send_weekly_reports.apply(kwargs={"week": "2026-W47"}, throw=True).get() == 1
