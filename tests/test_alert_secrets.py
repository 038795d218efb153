"""Webhook URLs and secrets at rest as Fernet tokens (issue 27 item 4: a home-made HMAC-CTR cipher although
`cryptography` is pinned), key rotation through MultiFernet, and the migration that re-seals old values."""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib
import secrets as stdlib_secrets

import pytest
from cryptography.fernet import Fernet
from django.apps import apps
from django.core.management import call_command

from jobs.alerts import secrets

URL = "https://hooks.slack.com/services/T000/B000/XXXX"


def _legacy_seal(plaintext: str, secret_key: str) -> str:
    """The pre-Fernet format, written here from its definition to test that old rows still open."""
    base = secret_key.encode()
    enc = hmac.new(base, b"efficiency alerts secret: encryption", hashlib.sha256).digest()
    mac = hmac.new(base, b"efficiency alerts secret: authentication", hashlib.sha256).digest()
    nonce = stdlib_secrets.token_bytes(16)
    data = plaintext.encode()
    stream = b"".join(hmac.new(enc, nonce + i.to_bytes(8, "big"), hashlib.sha256).digest() for i in range(4))
    ct = bytes(a ^ b for a, b in zip(data, stream, strict=False))
    tag = hmac.new(mac, nonce + ct, hashlib.sha256).digest()
    return "v1:" + base64.urlsafe_b64encode(nonce + ct + tag).decode()


def test_sealed_values_are_fernet_tokens_that_round_trip_and_refuse_tampering(settings):
    settings.ALERT_SECRET_KEYS = []
    sealed = secrets.seal(URL)
    assert sealed.startswith(secrets.PREFIX) and URL not in sealed
    Fernet(secrets.derived_key(settings.SECRET_KEY)).decrypt(sealed[len(secrets.PREFIX) :].encode())
    assert secrets.reveal(sealed) == URL
    assert secrets.reveal(sealed[:-6] + "AAAAAA") == ""
    assert secrets.seal("") == "" and secrets.reveal("") == ""


def test_rotating_secret_key_keeps_values_readable_through_the_fallbacks(settings):
    settings.ALERT_SECRET_KEYS = []
    old = settings.SECRET_KEY
    sealed = secrets.seal(URL)
    settings.SECRET_KEY = "a-new-private-key-" + "x" * 40
    assert secrets.reveal(sealed) == ""  # the old key is gone: unreadable, never garbage
    settings.SECRET_KEY_FALLBACKS = [old]
    assert secrets.reveal(sealed) == URL
    fresh = secrets.reseal(sealed)
    settings.SECRET_KEY_FALLBACKS = []
    assert secrets.reveal(fresh) == URL  # re-sealed under the new key


def test_explicit_fernet_keys_rotate_first_seals_all_open(settings):
    k1, k2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.ALERT_SECRET_KEYS = [k1]
    sealed = secrets.seal(URL)
    settings.ALERT_SECRET_KEYS = [k2, k1]
    assert secrets.reveal(sealed) == URL
    settings.ALERT_SECRET_KEYS = [k2]
    assert secrets.reveal(sealed) == ""


def test_legacy_values_open_and_are_resealed(settings):
    settings.ALERT_SECRET_KEYS = []
    legacy = _legacy_seal(URL, settings.SECRET_KEY)
    assert secrets.reveal(legacy) == URL
    assert secrets.reseal(legacy).startswith(secrets.PREFIX)
    assert secrets.reseal("v1:garbage") == "v1:garbage"  # unreadable: kept, not lost


@pytest.mark.django_db
def test_the_migration_and_the_command_reseal_stored_values(settings, make_team):
    from jobs.models import AlertSubscription

    settings.ALERT_SECRET_KEYS = []
    sub = AlertSubscription.objects.create(
        team=make_team("llm"), channel="slack", url_encrypted=_legacy_seal(URL, settings.SECRET_KEY)
    )
    migration = importlib.import_module("jobs.migrations.0018_reseal_alert_secrets")
    migration.reseal(apps, None)
    sub.refresh_from_db()
    assert sub.url_encrypted.startswith(secrets.PREFIX) and secrets.reveal(sub.url_encrypted) == URL
    settings.ALERT_SECRET_KEYS = [
        Fernet.generate_key().decode(),
        secrets.derived_key(settings.SECRET_KEY).decode(),
    ]
    call_command("reseal_alert_secrets")
    sub.refresh_from_db()
    settings.ALERT_SECRET_KEYS = settings.ALERT_SECRET_KEYS[:1]
    assert secrets.reveal(sub.url_encrypted) == URL  # now under the new first key alone


def test_a_malformed_key_stops_start_up():
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST"))}
    env["ALERT_SECRET_KEYS"] = "not-a-key"
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "ALERT_SECRET_KEYS: an entry is not a Fernet key" in result.stderr
