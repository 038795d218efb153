"""Webhook URLs and secrets at rest: Fernet tokens (AES-128-CBC + HMAC-SHA256, `cryptography`'s MultiFernet).

Keys: `ALERT_SECRET_KEYS` (comma-separated Fernet keys) when set, else keys derived from SECRET_KEY and
Django's SECRET_KEY_FALLBACKS. The first key seals; every key opens, so rotating is: put the new key first
(or the new SECRET_KEY with the old one in SECRET_KEY_FALLBACKS), run `manage.py reseal_alert_secrets`, then
drop the old key. A value sealed under no listed key reads as "" and the pages ask for it again.
A database dump alone does not reveal a Slack URL or a signing secret; pages never render the plaintext:
forms take them write-only and show "set".

Values sealed before Fernet (prefix "v1:", an HMAC-SHA256 counter-mode construction of our own) are still
opened, and migration 0018 re-sealed every stored one as Fernet.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

PREFIX = "f1:"
_LEGACY_PREFIX = "v1:"
_NONCE = 16
_TAG = 32


def derived_key(secret_key: str) -> bytes:
    """A Fernet key (32 url-safe base64 bytes) derived from a Django SECRET_KEY."""
    digest = hmac.new(secret_key.encode(), b"efficiency alerts secret: fernet", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest)


def _keys() -> list[bytes]:
    explicit = [k.encode() for k in getattr(settings, "ALERT_SECRET_KEYS", []) if k]
    if explicit:
        return explicit
    fallbacks = list(getattr(settings, "SECRET_KEY_FALLBACKS", []) or [])
    return [derived_key(k) for k in [settings.SECRET_KEY, *fallbacks]]


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(k) for k in _keys()])


def seal(plaintext: str) -> str:
    """The stored form of `plaintext` ("" stays ""), sealed under the first key."""
    if not plaintext:
        return ""
    return PREFIX + _fernet().encrypt(plaintext.encode()).decode()


def reveal(stored: str) -> str:
    """The plaintext of a sealed value, or "" when empty, tampered with or sealed under no current key."""
    if not stored:
        return ""
    if stored.startswith(PREFIX):
        try:
            return _fernet().decrypt(stored[len(PREFIX) :].encode()).decode("utf-8", "replace")
        except (InvalidToken, ValueError):
            return ""
    if stored.startswith(_LEGACY_PREFIX):
        return _reveal_legacy(stored, settings.SECRET_KEY)
    return ""


def reseal(stored: str) -> str:
    """`stored` sealed again under the first key (a legacy or older-key value becomes a current one); a value
    no key opens is returned as it is (nothing is lost: an admin may still restore the old key)."""
    plaintext = reveal(stored)
    return seal(plaintext) if plaintext else stored


def _reveal_legacy(stored: str, secret_key: str) -> str:
    """Open a value of the pre-Fernet format (HMAC-SHA256 keystream, encrypt-then-MAC), "" when it fails."""
    try:
        raw = base64.urlsafe_b64decode(stored[len(_LEGACY_PREFIX) :].encode())
    except ValueError:
        return ""
    if len(raw) < _NONCE + _TAG:
        return ""
    base = secret_key.encode()
    enc = hmac.new(base, b"efficiency alerts secret: encryption", hashlib.sha256).digest()
    mac = hmac.new(base, b"efficiency alerts secret: authentication", hashlib.sha256).digest()
    nonce, ct, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
    if not hmac.compare_digest(tag, hmac.new(mac, nonce + ct, hashlib.sha256).digest()):
        return ""
    stream = bytearray()
    counter = 0
    while len(stream) < len(ct):
        stream += hmac.new(enc, nonce + counter.to_bytes(8, "big"), hashlib.sha256).digest()
        counter += 1
    return bytes(a ^ b for a, b in zip(ct, stream, strict=False)).decode("utf-8", "replace")
