"""Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright against pytest-django's live_server.

Playwright's own browser downloads are never used: `executable_path` points at the system Chromium.
Every page a test opens records console errors, uncaught exceptions and Content-Security-Policy
violations; tests assert there are none. Screenshots go to test-artifacts/screenshots/ (gitignored).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT

CHROMIUM = Path(os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium"))
SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAPTOP = {"width": 1366, "height": 768}
PASSWORD = "pw-correct-horse"

# Playwright's sync API runs an event loop in the test thread; the test's own ORM calls stay synchronous.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

_CSP_LISTENER = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " " + e.blockedURI);
});
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything in this folder is a browser test; skip it (with the reason) when Chromium is absent."""
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.browser)
            if not CHROMIUM.exists():
                item.add_marker(pytest.mark.skip(reason=f"{CHROMIUM} is absent (Debian package 'chromium')"))


@pytest.fixture(scope="module")
def sims() -> dict[str, Any]:
    """The simulated jobs the page tests register (tests.browser.data), once per test module."""
    from tests.browser import data

    return data.simulate_all()


@pytest.fixture(scope="module")
def prom(sims: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Prometheus holding the simulated jobs' DCGM series, once per test module."""
    from tests.browser import data

    with data.prometheus_with(sims, tmp_path_factory.mktemp("browser-prom")) as server:
        yield server


@pytest.fixture
def member(catalog: None, make_team: Any, make_user: Any) -> Any:
    """alice, a member of the team "LLM pretraining" (a test module may define its own)."""
    return make_user("alice", teams=[make_team("llm", "LLM pretraining")])


@pytest.fixture
def catalog(transactional_db: None) -> None:
    """The seeded GPU catalog and price book. live_server needs committed data, so browser tests are
    transactional, and a transactional test before them may have flushed the migration's seed rows
    (Django's serialized_rollback restores them only while content-type ids never changed, which other
    transactional tests break); seeding is idempotent."""
    from jobs.demo.seed import seed_catalog
    from jobs.models import GpuModel, PriceEntry

    seed_catalog(GpuModel, PriceEntry)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield instance
        instance.close()


class Watched:
    """A page plus what went wrong on it: console errors, page errors, CSP violations."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.console_errors: list[str] = []
        self.page_errors: list[str] = []
        page.on("console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.page_errors.append(str(e)))

    def csp_violations(self) -> list[str]:
        """Violations reported by the browser since the page loaded."""
        return self.page.evaluate("window.__cspViolations || []")

    def assert_clean(self) -> None:
        """No console error, no uncaught exception, no CSP violation."""
        assert self.console_errors == [], self.console_errors
        assert self.page_errors == [], self.page_errors
        assert self.csp_violations() == []

    def shot(self, name: str, full_page: bool = True, selector: str | None = None) -> Path:
        """Save a screenshot (of the page, or of one element) under test-artifacts/screenshots/."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        if selector:
            self.page.locator(selector).screenshot(path=str(path))
        else:
            self.page.screenshot(path=str(path), full_page=full_page)
        return path


@pytest.fixture
def watched(browser: Any) -> Iterator[Watched]:
    """A fresh browser context at laptop size with the CSP listener installed."""
    context = browser.new_context(viewport=LAPTOP, device_scale_factor=1)
    context.add_init_script(_CSP_LISTENER)
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield Watched(page)
    context.close()


def log_in(watched: Watched, base_url: str, username: str) -> None:
    """Log in through the login form, as a person would."""
    page = watched.page
    page.goto(f"{base_url}/login/")
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base_url}/")
