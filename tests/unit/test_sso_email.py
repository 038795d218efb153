"""jobs.sso.emails: the first-login email rule, without a database."""

from __future__ import annotations

import pytest

from jobs.sso.emails import Account, EmailMatch, email_key, is_unambiguous, match_account, may_take_email

ALICE = Account(1, "alice@example.com", privileged=False, linked=False)
SAM = Account(2, "sam@example.com", privileged=False, linked=False)
ROOT = Account(3, "root@example.com", privileged=True, linked=False)


def test_the_key_is_nfkc_then_casefold():
    assert email_key("ASmith@Example.COM") == "asmith@example.com"
    assert email_key("ａlice@example.com") == "alice@example.com"  # full-width a, NFKC
    assert email_key("ſam@example.com") == "sam@example.com"  # long s folds to s
    assert email_key("Straße@example.com") == "strasse@example.com"
    # Unlike Postgres' UPPER() (ALICE), case folding keeps the dotless ı a letter of its own.
    assert email_key("alıce@example.com") != email_key("alice@example.com")


@pytest.mark.parametrize(
    ("address", "plain"),
    [
        ("alice@example.com", True),
        ("ASmith@Example.com", True),
        ("josé@example.com", True),  # NFC é, folds as it lower-cases
        ("alıce@example.com", True),  # its key is its own: it matches no alice
        ("ſam@example.com", False),
        ("ａlice@example.com", False),
        ("\u212aate@example.com", False),  # Kelvin sign K: NFKC makes it K
        ("straße@example.com", False),  # ß folds to ss
        ("jose\u0301@example.com", False),  # decomposed é: NFKC composes it
    ],
)
def test_addresses_that_the_key_would_turn_into_other_letters_are_ambiguous(address, plain):
    assert is_unambiguous(address) is plain


@pytest.mark.parametrize(
    "claimed", ["alıce@example.com", "ａlice@example.com", "ALİCE@example.com", "alice@example.co"]
)
def test_look_alikes_match_no_account(claimed):
    # Neither linked nor refused: the login gets an account of its own.
    assert match_account(claimed, True, [ALICE, SAM]) == EmailMatch()


def test_long_s_matches_no_account_although_its_key_is_the_accounts():
    assert email_key("ſam@example.com") == email_key(SAM.email)
    assert match_account("ſam@example.com", True, [SAM]).account is None


def test_a_verified_address_matches_the_account_with_the_same_key():
    assert match_account("Alice@EXAMPLE.com", True, [ALICE, SAM]).account == ALICE


def test_an_unverified_address_matches_nothing():
    assert match_account("alice@example.com", False, [ALICE]).account is None
    assert match_account("alice@example.com", False, [ALICE]).refusal is None


def test_a_stored_look_alike_is_not_matched_either():
    stored = Account(4, "ſam@example.com", privileged=False, linked=False)
    assert match_account("sam@example.com", True, [stored]).account is None


def test_administrators_linked_accounts_and_duplicates_refuse_the_login():
    refused = match_account("root@example.com", True, [ALICE, ROOT])
    assert refused.account is None and "administrator account" in (refused.refusal or "")
    linked = Account(5, "bob@example.com", privileged=False, linked=True)
    refused = match_account("bob@example.com", True, [linked])
    assert refused.account is None and "already linked" in (refused.refusal or "")
    twin = Account(6, "ALICE@example.com", privileged=False, linked=False)
    refused = match_account("alice@example.com", True, [ALICE, twin])
    assert refused.account is None and "2 accounts have" in (refused.refusal or "")


def test_a_linked_user_takes_a_new_address_only_when_verified_and_nobody_elses():
    assert may_take_email(1, "alice.l@example.com", True, [ALICE, SAM])
    assert not may_take_email(1, "alice.l@example.com", False, [ALICE, SAM])
    assert not may_take_email(1, "SAM@example.com", True, [ALICE, SAM])
    assert not may_take_email(1, "ſam@example.com", True, [ALICE, SAM])  # sam's by its key
    assert may_take_email(1, "ALICE@example.com", True, [ALICE, SAM])  # her own, re-cased
