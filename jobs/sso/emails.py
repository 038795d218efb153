"""Which local account, if any, an SSO identity's first login may take over by email. Pure: no Django.

Once linked, an identity signs in by (issuer, subject) only (jobs.sso.backend, jobs.models.SsoIdentity):
the email is a claim that changes and can be reassigned; OIDC Core 5.7 names (iss, sub) as the only stable
key. Email matters once, at an identity's first login, to link an existing local account, and then only
under these rules (`match_account`):

- only a verified email (``email_verified`` true) is matched at all;
- addresses are compared exactly on their key, NFKC normalisation then case folding, both sides, in Python
  (Django's own comparison for password-reset emails since CVE-2019-19844). Never the database's
  ``iexact``: Postgres runs it as ``UPPER(a) = UPPER(b)``, and ``UPPER('alıce')`` (dotless ı) is
  ``ALICE``, so a provider's "alıce@example.com" found local alice;
- an address that NFKC or case folding would turn into other letters than plain lower-casing does
  (long s "ſ" -> "s", full-width "ａ" -> "a", the Kelvin sign "K" -> "k", "ß" -> "ss") is matched to
  nothing, on either side: equal keys then do not mean the same mailbox (the provider verified the
  look-alike address, not the account's), so such a login gets its own account instead;
- never to a staff or superuser account (an admin links those explicitly), never to an account another
  SSO identity is already linked to, and never when several accounts share the key.

`may_take_email` decides whether a linked user's email is updated from a later login's claim.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass


def email_key(address: str) -> str:
    """The comparison key of an email address: NFKC normalisation, then case folding (Unicode 15, Python's
    str.casefold)."""
    return unicodedata.normalize("NFKC", address).casefold()


def is_unambiguous(address: str) -> bool:
    """True when the key changes the address no more than lower-casing does: no compatibility character
    (NFKC leaves it as it is) and no letter that case folding maps beyond its lower case (ſ, ß, ς)."""
    return unicodedata.normalize("NFKC", address) == address and address.casefold() == address.lower()


@dataclass(frozen=True)
class Account:
    """What the rule needs to know of a local account."""

    pk: int
    email: str
    privileged: bool  # staff or superuser
    linked: bool  # an SSO identity is linked to it already


@dataclass(frozen=True)
class EmailMatch:
    """The account a first login links to (None: create a new account), or why the login is refused."""

    account: Account | None = None
    refusal: str | None = None


def match_account(claimed: str, verified: bool, accounts: Iterable[Account]) -> EmailMatch:
    """The existing account a new identity with email `claimed` links to, under the module's rules."""
    if not verified or not claimed or not is_unambiguous(claimed):
        return EmailMatch()
    key = email_key(claimed)
    found = [a for a in accounts if a.email and is_unambiguous(a.email) and email_key(a.email) == key]
    if not found:
        return EmailMatch()
    if len(found) > 1:
        return EmailMatch(
            refusal=f"{len(found)} accounts have the email address {claimed}; an admin must link this "
            "sign-in to one of them"
        )
    account = found[0]
    if account.privileged:
        return EmailMatch(
            refusal=f"the email address {claimed} belongs to an administrator account, which single sign-on "
            "never signs in by email; an admin can link this sign-in to it (SSO identities in the admin)"
        )
    if account.linked:
        return EmailMatch(
            refusal=f"the account with the email address {claimed} is already linked to another single "
            "sign-on identity; an admin can link this one to it too"
        )
    return EmailMatch(account=account)


def may_take_email(user_pk: int, claimed: str, verified: bool, accounts: Iterable[Account]) -> bool:
    """Whether a linked user's email may become `claimed`: only a verified address, and only when no other
    account has the same key (a changed address at the provider must not give this user another account's
    email, which password resets and reports are sent to)."""
    if not verified or not claimed:
        return False
    key = email_key(claimed)
    return not any(a.pk != user_pk and a.email and email_key(a.email) == key for a in accounts)
