"""Project wiring: migrations, admin, schema, static files, CSP, compose file vs settings, deploy checks."""

import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.contrib.staticfiles import finders
from django.core.management import call_command

from tests.conftest import REPO_ROOT

SETTINGS = REPO_ROOT / "efficiency" / "settings.py"


def _settings_env_names() -> set[str]:
    return set(re.findall(r'env_\w+\(\s*"([A-Z_]+)"', SETTINGS.read_text()))


@pytest.mark.django_db
def test_no_missing_migrations():
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)


@pytest.mark.django_db
def test_gpu_catalog_and_price_book_are_seeded():
    from jobs.models import GpuModel, PriceEntry

    assert GpuModel.objects.filter(name="H100 SXM").exists()
    assert GpuModel.objects.get(name="H100 SXM").peak_tflops["bf16"] == pytest.approx(989.5)
    assert PriceEntry.objects.filter(gpu_model__name="H100 SXM", tier="on_demand").exists()


@pytest.mark.django_db
def test_admin_pages_load_for_staff(client, make_user, make_team, api_client_for):
    from tests.conftest import job_body

    make_team("llm")
    admin = make_user("root", staff=True)
    admin.is_superuser = True
    admin.save()
    api_client_for(admin).post("/api/v1/jobs/", job_body(), format="json")
    client.force_login(admin)
    assert client.get("/admin/").status_code == 200
    for model in [
        "team",
        "gpumodel",
        "priceentry",
        "job",
        "artifact",
        "finding",
        "baseline",
        "apitoken",
        "reportdelivery",
    ]:
        assert client.get(f"/admin/jobs/{model}/").status_code == 200, model
        # Baselines are not added by hand: runs join only through baselines.promote (issue 23 item 3).
        expected = 403 if model == "baseline" else 200
        assert client.get(f"/admin/jobs/{model}/add/").status_code == expected, model
    from jobs.models import Job

    assert client.get(f"/admin/jobs/job/{Job.objects.get().pk}/change/").status_code == 200


@pytest.mark.django_db
def test_admin_creates_a_token_and_shows_the_key_once(client, make_user):
    from jobs.models import ApiToken

    admin = make_user("root", staff=True)
    admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    response = client.post(
        "/admin/jobs/apitoken/add/", {"user": admin.pk, "name": "slurm", "kind": "user"}, follow=True
    )
    assert response.status_code == 200
    token = ApiToken.objects.get()
    shown = [str(m) for m in response.context["messages"]]
    assert any(token.prefix in m and "not be shown again" in m for m in shown)
    # A scheduler credential needs its cluster (the model's check constraint, validated by the form).
    form = {"user": admin.pk, "name": "prolog", "kind": "scheduler", "cluster": ""}
    assert client.post("/admin/jobs/apitoken/add/", form).status_code == 200  # the form again, with the error
    assert ApiToken.objects.count() == 1
    client.post("/admin/jobs/apitoken/add/", {**form, "cluster": "slurm-a"})
    assert ApiToken.objects.filter(kind="scheduler", cluster="slurm-a").count() == 1


@pytest.mark.django_db
def test_openapi_schema_and_docs_are_served(client, make_user):
    response = client.get("/api/schema/")
    assert response.status_code in (401, 403)  # the schema needs a login or token like the rest of the API
    client.force_login(make_user("alice"))
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/jobs/" in schema.content
    assert client.get("/api/docs/").status_code == 200


def test_plotly_is_served_from_our_static_files():
    found = finders.find("vendor/plotly.min.js")
    assert found and Path(found).stat().st_size > 1_000_000


def test_templates_have_no_inline_javascript_or_cdn_links():
    for path in (REPO_ROOT / "templates").rglob("*.html"):
        text = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text), f"inline script in {path}"
        assert not re.search(r"\son[a-z]+\s*=", text), f"inline event handler in {path}"
        assert not re.search(r"(src|href)=\"https?://", text), f"external asset in {path}"


@pytest.mark.django_db
def test_pages_send_a_strict_content_security_policy(client, make_user):
    client.force_login(make_user("alice"))
    csp = client.get("/")["Content-Security-Policy"]
    script_src = next(d for d in csp.split(";") if d.strip().startswith("script-src"))
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src


def test_compose_file_services_and_environment_match_the_settings():
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    assert {"postgres", "redis", "prometheus", "web", "worker", "beat"} <= set(compose["services"])
    for name in ("web", "worker", "beat"):
        assert compose["services"][name].get("healthcheck") or name == "beat"
    known = _settings_env_names()
    app_env = compose["x-app"]["environment"]
    assert set(app_env) <= known, set(app_env) - known
    example = {
        line.split("=", 1)[0]
        for line in (REPO_ROOT / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert example - {"POSTGRES_PASSWORD"} <= known, example - known
    assert {"SECRET_KEY", "ALLOWED_HOSTS"} <= example


def test_readme_documents_every_setting():
    readme = (REPO_ROOT / "README.md").read_text()
    missing = sorted(name for name in _settings_env_names() if f"`{name}`" not in readme)
    assert not missing, f"README configuration table lacks {missing}"


def _run_django(env_overrides: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST"))}
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_bad_setting_stops_start_up_with_a_clear_message():
    result = _run_django({"DEBUG": "ture"}, "check")
    assert result.returncode != 0
    assert "DEBUG='ture' is not a boolean" in result.stderr
    result = _run_django({"DEBUG": "false"}, "check")
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_deploy_check_is_clean_in_a_production_like_environment():
    result = _run_django(
        {
            "DEBUG": "false",
            "SECRET_KEY": "x7#kq2!pv9zL0e$Wm4rT8bN1cY6uH3jF5sA-dG_qZ@oP&lK*iM",
            "ALLOWED_HOSTS": "efficiency.example.com",
            "SITE_URL": "https://efficiency.example.com",
        },
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_debug_is_off_unless_set():
    """Issue 27 item 4: settings defaulted to DEBUG=True. A process started without DEBUG now runs like a
    deployment: it refuses to start without a private SECRET_KEY, and with one it has DEBUG off."""
    dropped = ("DJANGO_", "PYTEST", "DEBUG", "SECRET_KEY")
    base = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}

    def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "manage.py", *args]
        return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=99)

    result = run(base, "check")
    assert result.returncode != 0 and "SECRET_KEY is required but not set" in result.stderr
    code = "from django.conf import settings; print('DEBUG', settings.DEBUG)"
    result = run({**base, "SECRET_KEY": "a-private-key-" + "x" * 40}, "shell", "-c", code)
    assert result.returncode == 0, result.stderr
    assert "DEBUG False" in result.stdout


def test_no_test_flushes_the_shared_redis():
    """`cache.clear()` on the Redis cache is FLUSHDB on the database the broker and redbeat share: a test that
    ran it emptied every other process's queues. Tests use tests.conftest.clear_private_cache, or a locmem
    cache (the `local_cache` fixtures) where clear() is private."""
    offenders = []
    for path in (REPO_ROOT / "tests").rglob("*.py"):
        text = path.read_text()
        calls = [line for line in text.splitlines() if line.strip().startswith("cache.clear()")]
        if calls and "LocMemCache" not in text:
            offenders.append(str(path.relative_to(REPO_ROOT)))
    assert offenders == []
