"""Webhook URLs and secrets at rest: encrypted and authenticated with a key derived from SECRET_KEY.

Standard library only (no `cryptography` in the pinned set): an HMAC-SHA256 keystream (counter mode) over a
random 16-byte nonce, then HMAC-SHA256 over nonce + ciphertext (encrypt-then-MAC), with separate derived
keys for the two. A database dump alone does not reveal a Slack URL or a signing secret; rotating
SECRET_KEY makes stored values undecryptable (`reveal` returns "" and pages ask for them again).
Pages never render the plaintext: forms take them write-only and show "set".
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from django.conf import settings

_PREFIX = "v1:"
_NONCE = 16
_TAG = 32


def _keys() -> tuple[bytes, bytes]:
    base = settings.SECRET_KEY.encode()
    enc = hmac.new(base, b"efficiency alerts secret: encryption", hashlib.sha256).digest()
    mac = hmac.new(base, b"efficiency alerts secret: authentication", hashlib.sha256).digest()
    return enc, mac


def _stream(key: bytes, nonce: bytes, length: int) -> bytes:
    out = bytearray()
    counter = 0
    while len(out) < length:
        out += hmac.new(key, nonce + counter.to_bytes(8, "big"), hashlib.sha256).digest()
        counter += 1
    return bytes(out[:length])


def seal(plaintext: str) -> str:
    """The stored form of `plaintext` ("" stays "")."""
    if not plaintext:
        return ""
    enc, mac = _keys()
    nonce = secrets.token_bytes(_NONCE)
    data = plaintext.encode()
    ct = bytes(a ^ b for a, b in zip(data, _stream(enc, nonce, len(data)), strict=True))
    tag = hmac.new(mac, nonce + ct, hashlib.sha256).digest()
    return _PREFIX + base64.urlsafe_b64encode(nonce + ct + tag).decode()


def reveal(stored: str) -> str:
    """The plaintext of a sealed value, or "" when empty, tampered with or sealed under another key."""
    if not stored or not stored.startswith(_PREFIX):
        return ""
    try:
        raw = base64.urlsafe_b64decode(stored[len(_PREFIX) :].encode())
    except ValueError:
        return ""
    if len(raw) < _NONCE + _TAG:
        return ""
    nonce, ct, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
    enc, mac = _keys()
    if not hmac.compare_digest(tag, hmac.new(mac, nonce + ct, hashlib.sha256).digest()):
        return ""
    data = bytes(a ^ b for a, b in zip(ct, _stream(enc, nonce, len(ct)), strict=True))
    return data.decode("utf-8", "replace")
