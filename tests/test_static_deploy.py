"""Static files as deployed (and as `make demo` now runs: DEBUG=false): WhiteNoise's compressed manifest
storage serves plotly.js gzip-compressed under a hashed name, cached for a year; unknown URLs get the plain
404 page."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command
from django.templatetags.static import static
from django.test import Client, override_settings

_MANIFEST = {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"}


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """collectstatic once per module into a private STATIC_ROOT (about 12 s: gzip of plotly's 4.8 MB)."""
    from django.conf import settings

    root = tmp_path_factory.mktemp("staticfiles")
    with override_settings(
        DEBUG=False, STATIC_ROOT=root, STORAGES={**settings.STORAGES, "staticfiles": _MANIFEST}
    ):
        t0 = time.monotonic()
        call_command("collectstatic", "--noinput", verbosity=0)
        print(f"collectstatic into {root}: {time.monotonic() - t0:.1f} s")
    return root


@pytest.fixture
def deployed_static(settings, collected):
    settings.DEBUG = False
    settings.STATIC_ROOT = collected
    settings.STORAGES = {**settings.STORAGES, "staticfiles": _MANIFEST}
    return collected


def test_plotly_is_served_compressed_with_a_long_cache_lifetime(deployed_static, db):
    url = static("vendor/plotly.min.js")
    assert url != "/static/vendor/plotly.min.js" and url.endswith(".js")  # a hashed (immutable) name
    client = Client()  # a fresh handler: WhiteNoise reads STATIC_ROOT when its middleware is built
    response = client.get(url, headers={"accept-encoding": "gzip, deflate, br"})
    assert response.status_code == 200
    assert response.headers["Content-Encoding"] == "gzip"
    cache = response.headers["Cache-Control"]
    max_age = int(cache.split("max-age=")[1].split(",")[0])
    assert max_age >= 365 * 24 * 3600 and "immutable" in cache, cache
    size = int(response.headers["Content-Length"])
    raw = (deployed_static / url.removeprefix("/static/")).stat().st_size
    print(f"plotly.min.js: {raw / 1e6:.2f} MB raw, {size / 1e6:.2f} MB gzip over the wire; {cache}")
    # The partial bundle (static/vendor/README.md): 1.29 MB raw gzips to 0.45 MB (about 35 %).
    assert size < raw / 2 and size < 600_000
    plain = client.get(url)  # a client without gzip gets the plain file
    assert "Content-Encoding" not in plain.headers


def test_pages_link_hashed_static_names(deployed_static, make_user):
    client = Client()
    client.force_login(make_user("alice"))
    html = client.get("/").content.decode()
    assert static("css/app.css") in html and static("favicon.svg") in html
    assert "/static/css/app.css" not in html  # never the unhashed (short-lived) name


def test_unknown_url_is_a_plain_404_with_debug_false(deployed_static, make_user):
    client = Client()
    client.force_login(make_user("alice"))
    response = client.get("/jobs/nope/figures.json/extra")
    html = response.content.decode()
    assert response.status_code == 404
    assert "Page not found" in html and "URLconf" not in html and "api/v1/" not in html
