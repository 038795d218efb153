"""A small, real OpenID Connect provider for tests: threaded http.server on a free loopback port.

Serves discovery, /authorize (the "logged-in" user is whoever the test set, so it redirects straight
back with a code), /token (an RS256-signed ID token carrying the nonce; checks client secret,
redirect_uri and the PKCE verifier), /userinfo, /jwks and /logout. A test can make the next ID token
wrong on purpose (`provider.tamper = ...`) to check the client refuses it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

# What a test can break in the next ID token.
TAMPERS = ("bad_signature", "wrong_audience", "wrong_issuer", "expired", "bad_nonce", "unknown_kid")


@dataclass
class _Grant:
    claims: dict[str, Any]
    nonce: str | None
    client_id: str
    redirect_uri: str
    code_challenge: str | None


@dataclass
class OidcProvider:
    """The provider's state; `start()` serves it, `stop()` shuts it down."""

    client_id: str = "efficiency-test"
    client_secret: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    user: dict[str, Any] = field(default_factory=dict)
    tamper: str | None = None
    kid: str = "test-key-1"
    # Changes to /userinfo's answer (a None value drops the claim), e.g. groups only in the ID token.
    userinfo_overrides: dict[str, Any] = field(default_factory=dict)
    # Answer /userinfo as a signed JWT (application/jwt, OIDC Core 5.3.2) instead of JSON.
    userinfo_as_jwt: bool = False
    # Test inspection: the last token request's form.
    last_token_request: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._grants: dict[str, _Grant] = {}
        self._access: dict[str, dict[str, Any]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> OidcProvider:
        """Serve on 127.0.0.1 at a free port, in a daemon thread."""
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet test output
                return

            def do_GET(self) -> None:
                provider._handle(self, "GET")

            def do_POST(self) -> None:
                provider._handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def issuer(self) -> str:
        """The base URL, which is also the `iss` of its tokens."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def endpoints(self) -> dict[str, str]:
        """The endpoint URLs, as discovery lists them."""
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "userinfo_endpoint": f"{self.issuer}/userinfo",
            "jwks_uri": f"{self.issuer}/jwks",
            "end_session_endpoint": f"{self.issuer}/logout",
        }

    # -- HTTP ----------------------------------------------------------------------------------------
    def _handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(req.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        form: dict[str, str] = {}
        if method == "POST":
            length = int(req.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(req.rfile.read(length).decode()).items()}
        route = (method, url.path)
        if route == ("GET", "/.well-known/openid-configuration"):
            self._json(req, 200, {**self.endpoints(), "id_token_signing_alg_values_supported": ["RS256"]})
        elif route == ("GET", "/jwks"):
            self._json(req, 200, {"keys": [self._jwk()]})
        elif route == ("GET", "/authorize"):
            self._authorize(req, query)
        elif route == ("POST", "/token"):
            self._token(req, form)
        elif route == ("GET", "/userinfo"):
            token = (req.headers.get("Authorization") or "").removeprefix("Bearer ")
            with self._lock:
                claims = self._access.get(token)
            if claims is None:
                self._json(req, 401, {"error": "invalid_token"})
            else:
                answer = {**claims, **self.userinfo_overrides}
                answer = {k: v for k, v in answer.items() if v is not None}
                if self.userinfo_as_jwt:
                    signed = {**answer, "iss": self.issuer, "aud": self.client_id}
                    self._send(req, 200, "application/jwt", self._sign(signed, self.key, self.kid).encode())
                else:
                    self._json(req, 200, answer)
        elif route == ("GET", "/logout"):
            self._json(req, 200, {"logged_out": True})
        else:
            self._json(req, 404, {"error": "not_found"})

    def _json(self, req: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        self._send(req, status, "application/json", json.dumps(body).encode())

    def _send(self, req: BaseHTTPRequestHandler, status: int, content_type: str, data: bytes) -> None:
        req.send_response(status)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def _authorize(self, req: BaseHTTPRequestHandler, query: dict[str, str]) -> None:
        if query.get("client_id") != self.client_id or query.get("response_type") != "code":
            self._json(req, 400, {"error": "unauthorized_client"})
            return
        if "openid" not in query.get("scope", "").split() or not query.get("redirect_uri"):
            self._json(req, 400, {"error": "invalid_request"})
            return
        if query.get("code_challenge") and query.get("code_challenge_method") != "S256":
            self._json(req, 400, {"error": "invalid_request"})
            return
        code = secrets.token_urlsafe(16)
        with self._lock:
            self._grants[code] = _Grant(
                dict(self.user),
                query.get("nonce"),
                self.client_id,
                query["redirect_uri"],
                query.get("code_challenge"),
            )
        location = f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query.get('state', '')})}"
        req.send_response(302)
        req.send_header("Location", location)
        req.send_header("Content-Length", "0")
        req.end_headers()

    def _token(self, req: BaseHTTPRequestHandler, form: dict[str, str]) -> None:
        self.last_token_request = dict(form)
        with self._lock:
            grant = self._grants.pop(form.get("code", ""), None)  # a code is good once
        if grant is None or form.get("grant_type") != "authorization_code":
            self._json(req, 400, {"error": "invalid_grant"})
            return
        if form.get("client_id") != grant.client_id or form.get("client_secret") != self.client_secret:
            self._json(req, 401, {"error": "invalid_client"})
            return
        if form.get("redirect_uri") != grant.redirect_uri:
            self._json(req, 400, {"error": "invalid_grant", "error_description": "redirect_uri mismatch"})
            return
        if grant.code_challenge is not None:
            verifier = form.get("code_verifier", "").encode()
            expected = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=").decode()
            if expected != grant.code_challenge:
                self._json(req, 400, {"error": "invalid_grant", "error_description": "PKCE"})
                return
        access = secrets.token_urlsafe(16)
        with self._lock:
            self._access[access] = dict(grant.claims)
        self._json(
            req,
            200,
            {
                "access_token": access,
                "token_type": "Bearer",
                "expires_in": 300,
                "id_token": self.id_token(grant.claims, grant.nonce),
            },
        )

    # -- tokens --------------------------------------------------------------------------------------
    def id_token(self, claims: dict[str, Any], nonce: str | None) -> str:
        """An RS256 ID token for the claims, broken as `self.tamper` says (once)."""
        tamper, self.tamper = self.tamper, None
        now = int(time.time())
        payload: dict[str, Any] = {
            **claims,
            "iss": self.issuer,
            "aud": self.client_id,
            "iat": now,
            "exp": now + 300,
        }
        if nonce is not None:
            payload["nonce"] = nonce
        if tamper == "wrong_audience":
            payload["aud"] = "some-other-client"
        elif tamper == "wrong_issuer":
            payload["iss"] = "http://evil.example"
        elif tamper == "expired":
            payload["iat"], payload["exp"] = now - 3600, now - 1800
        elif tamper == "bad_nonce":
            payload["nonce"] = "not-the-nonce-we-were-sent"
        key = self.other_key if tamper == "bad_signature" else self.key
        kid = "no-such-key" if tamper == "unknown_kid" else self.kid
        return self._sign(payload, key, kid)

    def _sign(self, payload: dict[str, Any], key: rsa.RSAPrivateKey, kid: str) -> str:
        return jwt.encode(payload, key, algorithm="RS256", headers={"kid": kid})

    def _jwk(self) -> dict[str, Any]:
        numbers = self.key.public_key().public_numbers()

        def b64(n: int) -> str:
            return (
                base64.urlsafe_b64encode(n.to_bytes((n.bit_length() + 7) // 8, "big")).rstrip(b"=").decode()
            )

        return {
            "kty": "RSA",
            "use": "sig",
            "alg": "RS256",
            "kid": self.kid,
            "n": b64(numbers.n),
            "e": b64(numbers.e),
        }
