"""Every route x every role (issue #23 item 8): who may read and write what, checked for each URL the
URL configuration has, so no route ships without an access expectation.

The routes are not listed by hand: `ROUTES` walks `get_resolver().url_patterns` (pages, the API and its
format-suffix variants, SSO, probes). For each route the methods its view allows are found (DRF's
action map and handler methods, a class-based view's handlers, and for a function view every method
staff are not answered 405 for), and each (route, method) must have a row in `EXPECTED` that says, for
each role, what it gets: a new route, or a new method on one, fails `test_every_route_and_method_has_an_
access_expectation` until someone writes down who may use it (NetBox's view-test mixins are the model).

Roles: `anonymous`; `member` (alice, member of llm, the team that owns every object in the URLs); `other`
(bob, member of vision); `lead` (lena, lead of llm); `staff` (carol, staff, in no team); `token` (alice's
API token, no session: pages treat it as anonymous); `scheduler` (a cluster-scoped scheduler service
credential, `ApiToken.kind="scheduler"`, for the cluster of llm's job: skipped while the tree has no such
kind). READ_SCOPE=team (the deployed default). Every cell is one request; writes carry a plausible body
for the owning team's object, so an allowed role reaches the view's own validation (200/201/302/400),
and a role that must not write gets 401/403/404. After any request by a role outside llm, llm's rows
(jobs, baselines and their runs, artifacts, subscriptions, budget, idle policy) must be unchanged.

Django admin's 137 routes are Django's own permission system: one test per role checks that every admin
URL sends non-staff roles to the admin login (GET and POST) and never fails for staff.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "member", "other", "lead", "staff", "token", "scheduler")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

# -- the routes, from the URL configuration -----------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One URL pattern: `template` is its path with `{kwarg}` placeholders; `view` the resolved callable."""

    template: str
    name: str
    view: Callable[..., Any]

    @property
    def base(self) -> str:
        """The row of `EXPECTED` this route is checked against: a DRF format-suffix variant
        (`jobs/{external_id}.{format}`) answers exactly as its base route (`jobs/{external_id}/`)."""
        if self.template.endswith(".{format}") and self.template != "api/v1/.{format}":
            return self.template.removesuffix(".{format}") + "/"
        return self.template

    def path(self, kwargs: dict[str, str]) -> str:
        """The URL with the placeholders filled in."""
        return "/" + re.sub(r"\{(\w+)\}", lambda m: kwargs[m.group(1)], self.template)


def _template(pattern: str) -> str:
    """A Django `path()` or DRF regex pattern as a `{kwarg}` template."""
    text = re.sub(r"\(\?P<(\w+)>[^()]*\)", r"{\1}", pattern)  # regex groups (DRF's have no nested groups)
    text = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", text)  # path converters
    text = text.replace("^", "").replace("$", "").replace("/?", "").replace("\\.", ".")
    return text.replace("{format}", ".{format}").replace("..{format}", ".{format}")


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern))
        else:
            yield prefix + str(entry.pattern), entry


def all_routes() -> list[Route]:
    """Every route of the URL configuration, the first of two with the same template (the later one is
    unreachable: Django resolves the first match)."""
    seen: dict[str, Route] = {}
    for pattern, entry in _walk(get_resolver().url_patterns):
        template = _template(pattern)
        seen.setdefault(template, Route(template, entry.name or "", entry.callback))
    return list(seen.values())


def _class_methods(cls: type) -> set[str]:
    names = getattr(cls, "http_method_names", [])
    return {m.upper() for m in names if hasattr(cls, m) and m not in ("head", "options", "trace")}


def declared_methods(route: Route) -> set[str] | None:
    """The methods a class-based or DRF view declares; None for a function view (found by a request)."""
    actions = getattr(route.view, "actions", None)
    if actions:
        return {m.upper() for m in actions} & set(METHODS)
    cls = getattr(route.view, "cls", None) or getattr(route.view, "view_class", None)
    if cls is not None:
        return _class_methods(cls) & set(METHODS)
    return None


# -- the world every URL points into ------------------------------------------------------------------


@pytest.fixture
def world(settings, make_team, make_user, tmp_path):
    """llm owns a finished job with an artifact, a finding, a baseline, an alert subscription, a budget
    and an idle policy; vision owns a job of the same model and config."""
    from django.utils import timezone

    # The configuration the table describes: the demo's simulated exporter off (`make test` exports
    # DEMO_STATE_DIR for the demo, which switched it on under CI), OIDC off.
    settings.DEMO_STATE_DIR = ""

    from jobs.models import (
        AlertSubscription,
        ApiToken,
        Artifact,
        Baseline,
        Finding,
        IdlePolicy,
        Job,
        Membership,
    )

    settings.READ_SCOPE = "team"
    settings.MEDIA_ROOT = tmp_path / "media"
    # Five users per cell and hundreds of cells: a fast hasher (passwords are never checked here).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    llm, vision = make_team("llm"), make_team("vision")
    alice = make_user("alice", teams=[llm])
    lena = make_user("lena")
    Membership.objects.create(team=llm, user=lena, role=Membership.Role.LEAD)
    bob = make_user("bob", teams=[vision])
    carol = make_user("carol", staff=True)
    start = timezone.now() - timedelta(hours=8)

    def job(team: Any, external_id: str) -> Job:
        return Job.objects.create(
            team=team,
            external_id=external_id,
            name=f"name-{external_id}",
            owner="alice" if team == llm else "bob",
            model_name="llama-7b",
            config_fingerprint="f" * 64,
            gpu_count=8,
            gpus=[{"hostname": f"node-{external_id}", "gpu": str(i)} for i in range(8)],
            started_at=start,
            ended_at=start + timedelta(hours=6),
            status=Job.Status.ENDED,
            mfu=0.3,
        )

    mine, theirs = job(llm, "llm-001"), job(vision, "vis-001")
    job(llm, "llm-002")  # the second run of a comparison
    if hasattr(Job, "cluster"):
        Job.objects.filter(pk=mine.pk).update(cluster="cluster-a")
    artifact = Artifact.objects.create(
        job=mine,
        kind="pyspy_raw",
        original_name="profile.txt",
        sha256="a" * 64,
        size_bytes=10,
        status=Artifact.Status.DONE,
        uploaded_by=alice,
    )
    Finding.objects.create(
        job=mine,
        code="low_mfu",
        severity=Finding.Severity.WARNING,
        title="Low MFU",
        confidence=0.5,
        recommendation="Raise the micro-batch.",
        waste_per_day_usd=10.0,
    )
    baseline = Baseline.objects.create(
        fingerprint="f" * 64,
        model_name="llama-7b",
        team=llm,
        stats={"mfu": {"median": 0.3, "mad": 0.0, "iqr": 0.0, "n": 1, "min": 0.3, "max": 0.3}},
    )
    baseline.runs.add(mine)
    subscription = AlertSubscription.objects.create(team=llm, channel="email", email="oncall@example.com")
    IdlePolicy.objects.create(team=llm)
    _, member_key = ApiToken.issue(alice, "matrix")
    scheduler_key = None
    if "scheduler" in getattr(getattr(ApiToken, "Kind", None), "values", []):
        service = make_user("slurm-svc")
        _, scheduler_key = ApiToken.issue(service, "slurmctld", kind="scheduler", cluster="cluster-a")
    from jobs.outputs.leaderboard import iso_week

    return {
        "users": {"member": alice, "other": bob, "lead": lena, "staff": carol},
        "tokens": {"token": member_key, "scheduler": scheduler_key},
        "job": mine,
        "their_job": theirs,
        "kwargs": {
            "external_id": mine.external_id,
            "artifact_id": str(artifact.pk),
            "slug": llm.slug,
            "week": iso_week(timezone.now().date()).label,
            "format": "json",
        },
        # `{pk}` means a different object on each route.
        "pk": {
            "baseline": str(baseline.pk),
            "artifact": str(artifact.pk),
            "alert-subscription": str(subscription.pk),
        },
    }


# -- one request --------------------------------------------------------------------------------------


def _client(world: dict[str, Any], role: str) -> Any:
    from django.test import Client

    if role in ("token", "scheduler"):
        key = world["tokens"][role]
        if key is None:
            pytest.skip("no scheduler service credential (ApiToken.kind='scheduler') in this tree yet")
        return Client(headers={"authorization": f"Token {key}"})
    client = Client()
    if role != "anonymous":
        client.force_login(world["users"][role])
    return client


def _kwargs(world: dict[str, Any], route: Route) -> dict[str, str]:
    kwargs = dict(world["kwargs"])
    for prefix, key in (
        ("baselines/{pk}", "baseline"),
        ("artifacts/{pk}", "artifact"),
        ("subscriptions/{pk}", "alert-subscription"),
    ):
        if prefix in route.template:
            kwargs["pk"] = world["pk"][key]
    return kwargs


#: Query strings a route needs to mean something (else it answers 400 before any access check).
QUERY = {
    "jobs/compare/": "?a=llm-001&b=llm-002",
    "api/v1/jobs/compare/": "?a=llm-001&b=llm-002",
    # An unknown signal is refused (400) after the access check: a reader gets 400, others 404.
    "jobs/{external_id}/series.csv": "?signal=not-a-signal",
}


def _body(base: str, method: str) -> tuple[Any, str | None]:
    """A plausible body for a write: (data, content type; None = multipart form)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from tests.conftest import job_body

    if base in ("jobs/{external_id}/artifacts/", "api/v1/jobs/{external_id}/artifacts/"):
        return {"kind": "pyspy_raw", "file": SimpleUploadedFile("p.txt", b"main (a.py:1) 5\n")}, None
    if not base.startswith("api/"):
        return {
            "monthly_budget_usd": "1000",
            "channel": "email",
            "email": "x@example.com",
            "reason": "matrix",
            "action": "confirm",
        }, None
    json_bodies: dict[str, Any] = {
        "api/v1/jobs/": job_body(external_id="new-001", team="llm"),
        "api/v1/jobs/{external_id}/": {"name": "renamed by the matrix"},
        "api/v1/jobs/{external_id}/progress/": {"step": 100, "tokens": 1000000},
        "api/v1/baselines/": {"job": "llm-001"},
        "api/v1/artifacts/{pk}/review/": {"action": "confirm"},
    }
    return json_bodies.get(base, {}), "application/json"


def request(world: dict[str, Any], route: Route, method: str, role: str) -> Any:
    """`role`'s `method` request to `route` (into llm's objects)."""
    client = _client(world, role)
    path = route.path(_kwargs(world, route)) + QUERY.get(route.base, "")
    if method == "GET":
        return client.get(path)
    data, content_type = _body(route.base, method)
    call = getattr(client, method.lower())
    if content_type is None:
        if method == "POST":
            return call(path, data)
        from django.test.client import MULTIPART_CONTENT, encode_multipart

        return call(
            path,
            encode_multipart("BoUnDaRy", data),
            content_type=f"{MULTIPART_CONTENT[:19]}; boundary=BoUnDaRy",
        )
    import json

    return call(path, json.dumps(data), content_type=content_type)


def outcome(response: Any) -> str:
    """What a response means for access: login, ok, or the refusal's status."""
    from django.conf import settings
    from django.shortcuts import resolve_url

    status = response.status_code
    if status in (301, 302, 303, 307, 308):
        target = response.headers.get("Location", "")
        if target.startswith(str(resolve_url(settings.LOGIN_URL))):
            return "login"
        if target.startswith("/admin/login/"):
            return "admin-login"
        return "ok"
    if 200 <= status < 300:
        return "ok"
    return str(status)


# -- the expectations ---------------------------------------------------------------------------------

OK = frozenset({"ok"})  # 2xx, or a redirect that is not to a login page
LOGIN = frozenset({"login"})  # 302 to the login page
ALLOWED = frozenset({"ok", "400", "409"})  # through the access check (400/409: the view's own validation)
UNAUTH = frozenset({"401", "403"})  # the API without credentials
HIDDEN = frozenset({"404"})  # another team's object: the same answer as a missing one
REFUSED = frozenset({"403", "404"})  # a write the role may not make
FORBIDDEN = frozenset({"403"})
OFF = frozenset({"404"})  # a feature switched off in this configuration (OIDC, the demo exporter)
Row = dict[str, frozenset[str]]


def row(anonymous, member, other, lead, staff, token, scheduler) -> Row:  # type: ignore[no-untyped-def]
    """One (route, method)'s expected outcome per role."""
    return dict(zip(ROLES, (anonymous, member, other, lead, staff, token, scheduler), strict=True))


def every(outcome: frozenset[str]) -> Row:
    return {role: outcome for role in ROLES}


# Pages: anonymous and a bare API token go to the login page; another team's objects are 404.
PAGE_ANY = row(LOGIN, OK, OK, OK, OK, LOGIN, LOGIN)  # any signed-in user (lists scoped to readable teams)
PAGE_READ = row(LOGIN, OK, HIDDEN, OK, OK, LOGIN, LOGIN)  # llm's object
PAGE_CHECKED_READ = row(LOGIN, ALLOWED, HIDDEN, ALLOWED, ALLOWED, LOGIN, LOGIN)  # QUERY makes it a 400
PAGE_WRITE = row(LOGIN, ALLOWED, REFUSED, ALLOWED, ALLOWED, LOGIN, LOGIN)  # members of llm and staff
PAGE_LEAD_WRITE = row(LOGIN, FORBIDDEN, REFUSED, ALLOWED, ALLOWED, LOGIN, LOGIN)  # leads of llm and staff
PAGE_STAFF = row(LOGIN, FORBIDDEN, FORBIDDEN, FORBIDDEN, OK, LOGIN, LOGIN)
# The API: 401 without credentials; a member's token acts as the member; the scheduler credential reads
# and updates only jobs its cluster's integration registered (llm-001 was registered by hand: 404).
API_ANY = row(UNAUTH, OK, OK, OK, OK, OK, OK)  # lists scoped to readable teams
API_READ = row(UNAUTH, OK, HIDDEN, OK, OK, OK, HIDDEN)
API_WRITE = row(UNAUTH, ALLOWED, REFUSED, ALLOWED, ALLOWED, ALLOWED, REFUSED)
API_REGISTER = row(UNAUTH, ALLOWED, REFUSED, ALLOWED, ALLOWED, ALLOWED, ALLOWED)  # a new job of team llm

EXPECTED: dict[tuple[str, str], Row] = {
    # Probes and sign-in: public; /metrics needs METRICS_TOKEN, which none of these roles holds.
    ("healthz", "GET"): every(OK),
    ("metrics", "GET"): every(FORBIDDEN),
    **{("simulated/dcgm-exporter/metrics", m): every(OFF) for m in METHODS},  # only with DEMO_EXPORTER
    ("login/", "GET"): every(OK),
    ("login/", "POST"): every(OK),  # the form again, with its errors (no credentials sent)
    ("login/", "PUT"): every(OK),  # Django's FormView treats PUT as POST
    ("logout/", "POST"): every(LOGIN),
    ("oidc/authenticate/", "GET"): every(OFF),  # OIDC_ENABLED=false
    ("oidc/callback/", "GET"): every(OFF),
    # API
    ("api/v1/", "GET"): API_ANY,
    ("api/schema/", "GET"): API_ANY,
    ("api/docs/", "GET"): API_ANY,
    ("api/v1/leaderboard/", "GET"): API_ANY,
    ("api/v1/alerts/", "GET"): API_ANY,
    ("api/v1/jobs/", "GET"): API_ANY,
    ("api/v1/jobs/", "POST"): API_REGISTER,
    ("api/v1/jobs/compare/", "GET"): API_READ,
    ("api/v1/jobs/{external_id}/", "GET"): API_READ,
    ("api/v1/jobs/{external_id}/", "PATCH"): API_WRITE,
    ("api/v1/jobs/{external_id}/artifacts/", "GET"): API_READ,
    ("api/v1/jobs/{external_id}/artifacts/", "POST"): API_WRITE,
    ("api/v1/jobs/{external_id}/progress/", "POST"): API_WRITE,
    ("api/v1/baselines/", "GET"): API_ANY,
    ("api/v1/baselines/", "POST"): API_WRITE,  # promote llm-001 into llm's baseline
    ("api/v1/baselines/{pk}/", "GET"): API_READ,
    ("api/v1/baselines/{pk}/retire/", "POST"): API_WRITE,
    ("api/v1/artifacts/", "GET"): API_ANY,
    ("api/v1/artifacts/{pk}/", "GET"): API_READ,
    ("api/v1/artifacts/{pk}/reparse/", "POST"): API_WRITE,
    ("api/v1/artifacts/{pk}/review/", "POST"): API_WRITE,
    # Pages
    ("", "GET"): PAGE_ANY,
    ("jobs.csv", "GET"): PAGE_ANY,
    ("leaderboard.csv", "GET"): PAGE_ANY,
    ("leaderboard/", "GET"): PAGE_ANY,
    ("teams/", "GET"): PAGE_ANY,
    ("baselines/", "GET"): PAGE_ANY,
    ("catalog/", "GET"): PAGE_ANY,
    ("readiness/", "GET"): PAGE_ANY,
    ("settings/", "GET"): PAGE_STAFF,
    # The signed-in user's own subscriptions; the view answers every method as a read.
    **{("alerts/mine/", m): PAGE_ANY for m in METHODS},
    ("jobs/compare/", "GET"): PAGE_READ,
    ("jobs/{external_id}/", "GET"): PAGE_READ,
    ("jobs/{external_id}/figures.json", "GET"): PAGE_READ,
    ("jobs/{external_id}/series.csv", "GET"): PAGE_CHECKED_READ,
    ("jobs/{external_id}/artifacts/", "POST"): PAGE_WRITE,
    ("jobs/{external_id}/artifacts/{artifact_id}/reparse/", "POST"): PAGE_WRITE,
    ("jobs/{external_id}/artifacts/{artifact_id}/review/", "POST"): PAGE_WRITE,
    ("jobs/{external_id}/promote/", "POST"): PAGE_WRITE,
    ("teams/{slug}/", "GET"): PAGE_READ,
    ("teams/{slug}/budget/", "POST"): PAGE_LEAD_WRITE,
    # Reads that answer every method as a read (no state changes on POST/PUT/PATCH/DELETE).
    **{("teams/{slug}/reports/{week}/", m): PAGE_READ for m in METHODS},
    **{("teams/{slug}/alerts/", m): PAGE_READ for m in METHODS},
    ("teams/{slug}/alerts/subscriptions/", "POST"): PAGE_WRITE,
    ("teams/{slug}/alerts/idle-policy/", "POST"): PAGE_WRITE,
    ("alerts/subscriptions/{pk}/delete/", "POST"): PAGE_WRITE,  # llm's team subscription
    ("baselines/{pk}/retire/", "POST"): PAGE_WRITE,
}

#: Cells where the tree does not (yet) do what issue #23 asks, in code another engineer is changing:
#: strict xfails, so each turns into a failure to remove here once the hole is closed.
HOLES: dict[tuple[str, str, str], str] = {}

#: Roles outside llm: after their request, llm's rows must be exactly as before.
OUTSIDERS = ("anonymous", "other")


def _non_admin_routes() -> list[Route]:
    return [r for r in all_routes() if not r.template.startswith("admin/")]


def _cells() -> Iterator[Any]:
    for route in _non_admin_routes():
        for (base, method), _ in EXPECTED.items():
            if base != route.base:
                continue
            for role in ROLES:
                marks = []
                if (route.base, method, role) in HOLES:
                    marks.append(pytest.mark.xfail(strict=True, reason=HOLES[(route.base, method, role)]))
                yield pytest.param(
                    route.template, method, role, marks=marks, id=f"{method} /{route.template} {role}"
                )


def _llm_state(world: dict[str, Any]) -> dict[str, Any]:
    """Everything team llm owns that a request could change."""
    from jobs.models import AlertSubscription, Artifact, Baseline, IdlePolicy, Job, Membership, Team

    llm = Team.objects.get(slug="llm")
    return {
        "team": list(Team.objects.filter(pk=llm.pk).values()),
        "members": sorted(Membership.objects.filter(team=llm).values_list("user_id", "role")),
        "jobs": list(Job.objects.filter(team=llm).order_by("pk").values()),
        "baselines": list(Baseline.objects.filter(team=llm).order_by("pk").values()),
        "baseline_runs": sorted(
            Baseline.runs.through.objects.filter(baseline__team=llm).values_list("baseline_id", "job_id")
        ),
        "artifacts": list(Artifact.objects.filter(job__team=llm).order_by("pk").values()),
        "subscriptions": list(AlertSubscription.objects.filter(team=llm).order_by("pk").values()),
        "idle_policy": list(IdlePolicy.objects.filter(team=llm).values()),
    }


def _route(template: str) -> Route:
    return next(r for r in all_routes() if r.template == template)


@pytest.mark.parametrize(("template", "method", "role"), list(_cells()))
def test_route_answers_each_role_as_expected(world, template, method, role):
    route = _route(template)
    expected = EXPECTED[(route.base, method)][role]
    before = _llm_state(world) if role in OUTSIDERS else None
    got = outcome(request(world, route, method, role))
    assert got in expected, f"{method} /{template} as {role}: got {got}, expected one of {sorted(expected)}"
    if before is not None:
        assert _llm_state(world) == before, f"{method} /{template} as {role} changed team llm's data"


def allowed_methods(world: dict[str, Any], route: Route) -> set[str]:
    """The methods `route`'s view takes: declared by a class-based or DRF view, else every method a
    function view does not answer 405 (as staff, who pass every access check)."""
    declared = declared_methods(route)
    if declared is not None:
        return declared
    return {m for m in METHODS if request(world, route, m, "staff").status_code != 405}


def test_every_route_and_method_has_an_access_expectation(world):
    routes = _non_admin_routes()
    assert len(routes) > 40  # the walk found the URL configuration, not an empty list
    missing = []
    for route in routes:
        for method in sorted(allowed_methods(world, route)):
            if (route.base, method) not in EXPECTED:
                missing.append(f"{method} /{route.template}")
    assert not missing, (
        "new route without an access expectation (add a row to EXPECTED in tests/test_route_matrix.py): "
        + ", ".join(missing)
    )


def test_every_expectation_names_a_route_and_method_that_exist(world):
    live = {(r.base, m) for r in _non_admin_routes() for m in allowed_methods(world, r)}
    stale = sorted(f"{m} /{base}" for base, m in EXPECTED if (base, m) not in live)
    assert not stale, f"rows of EXPECTED for routes or methods that no longer exist: {stale}"


def test_a_route_without_a_row_is_reported_as_missing(world, monkeypatch):
    # The guard itself: drop one row and the coverage check must name that route.
    row_key = ("teams/{slug}/budget/", "POST")
    monkeypatch.delitem(EXPECTED, row_key)
    with pytest.raises(
        AssertionError, match=r"new route without an access expectation.*POST /teams/\{slug\}/budget/"
    ):
        test_every_route_and_method_has_an_access_expectation(world)


def test_another_teams_member_cannot_join_or_change_llms_baseline_with_their_own_run(world):
    """Issue #23: bob promotes his own run of the same model and config through the API; llm's baseline
    keeps its runs and statistics (a vision baseline of its own is fine)."""
    from jobs.models import Baseline

    before = _llm_state(world)
    client = _client(world, "other")
    response = client.post("/api/v1/baselines/", {"job": "vis-001"}, content_type="application/json")
    assert response.status_code < 500
    assert _llm_state(world)["baseline_runs"] == before["baseline_runs"]
    assert _llm_state(world)["baselines"] == before["baselines"]
    assert not Baseline.objects.filter(team__slug="llm", runs__external_id="vis-001").exists()


# -- Django admin -------------------------------------------------------------------------------------


def _admin_routes() -> list[Route]:
    return [r for r in all_routes() if r.template.startswith("admin/")]


def _admin_path(route: Route) -> str:
    from django.contrib.contenttypes.models import ContentType

    values = {
        "app_label": "jobs",
        "object_id": "1",
        "content_type_id": str(ContentType.objects.first().pk if ContentType.objects.exists() else 1),
        "url": "jobs/job/",
    }
    return route.path(
        {**values, **{k: "1" for k in re.findall(r"\{(\w+)\}", route.template) if k not in values}}
    )


@pytest.mark.parametrize("role", ["anonymous", "member", "other", "lead", "token"])
def test_every_admin_url_sends_non_staff_to_the_admin_login(world, role):
    client = _client(world, role)
    open_to_all = {"admin/login/", "admin/logout/", "admin/password_change/", "admin/password_change/done/"}
    wrong = []
    routes = _admin_routes()
    assert len(routes) > 50
    for route in routes:
        if route.template in open_to_all:
            continue
        for method in ("GET", "POST"):
            response = client.generic(method, _admin_path(route))
            # Anonymous callers meet the site's login first (LoginRequiredMiddleware), members the admin's.
            if outcome(response) not in ("admin-login", "login"):
                where = response.headers.get("Location", "")
                wrong.append(f"{method} /{route.template}: {response.status_code} {where}")
    assert not wrong, wrong


def test_admin_urls_never_fail_for_staff(world):
    client = _client(world, "staff")
    failures = [
        f"/{route.template}: {status}"
        for route in _admin_routes()
        if route.template != "admin/logout/" and (status := client.get(_admin_path(route)).status_code) >= 500
    ]
    assert not failures, failures


#: Routes every signed-in role may read (PAGE_ANY/API_ANY) that list jobs, baselines or artifacts: under
#: READ_SCOPE=team another team's member sees none of llm's there.
LISTS = ("", "jobs.csv", "leaderboard/", "leaderboard.csv", "baselines/", "alerts/mine/")
API_LISTS = (
    "api/v1/jobs/",
    "api/v1/baselines/",
    "api/v1/artifacts/",
    "api/v1/alerts/",
    "api/v1/leaderboard/",
)


@pytest.mark.parametrize("template", [*LISTS, *API_LISTS])
def test_lists_open_to_every_role_name_none_of_another_teams_jobs(world, template):
    route = _route(template)
    response = request(world, route, "GET", "other")
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert response.status_code == 200
    assert b"llm-001" not in body and b"profile.txt" not in body
    mine = (
        b"".join(r.streaming_content)
        if (r := request(world, route, "GET", "member")).streaming
        else r.content
    )
    if template in ("", "jobs.csv", "api/v1/jobs/", "api/v1/baselines/", "api/v1/artifacts/"):
        assert b"llm-001" in mine or b"profile.txt" in mine  # the check above can fail: llm's member sees it
