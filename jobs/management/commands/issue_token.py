"""`manage.py issue_token`: create an API token and print its key once (only its hash is stored).

A user token acts as its user (`--user alice`). A scheduler token (`--scheduler --cluster a`) is the
cluster-scoped service credential of a scheduler integration (Slurm prolog/epilog, the Kubernetes
registrar): it registers, updates and ends jobs of any team on that cluster (jobs.access.ownership). It is
recorded under a service account (`--user`, default `scheduler-<cluster>`), created without a password or
team when missing: the account is only whom the token is filed under, never a login.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from jobs.models import ApiToken


class Command(BaseCommand):
    help = "Issue an API token (a user's, or a cluster's scheduler credential) and print its key once."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--name", required=True, help="what uses it, e.g. 'slurm prolog on cluster a'")
        parser.add_argument("--user", default="", help="the user (user tokens) or service account")
        parser.add_argument("--scheduler", action="store_true", help="a scheduler integration's credential")
        parser.add_argument("--cluster", default="", help="the scheduler cluster (with --scheduler)")

    def handle(self, *args: Any, **opts: Any) -> None:
        users = get_user_model().objects
        cluster = opts["cluster"].strip()
        if opts["scheduler"]:
            if not cluster:
                raise CommandError("a scheduler token needs --cluster (the cluster it speaks for)")
            username = opts["user"] or f"scheduler-{cluster}"
            user, created = users.get_or_create(username=username)
            if created:
                user.set_unusable_password()
                user.save()
            if user.is_staff or user.is_superuser:
                raise CommandError(f"{username!r} is staff: file scheduler tokens under a service account")
            kind = ApiToken.Kind.SCHEDULER
        else:
            if cluster:
                raise CommandError("--cluster is for scheduler tokens (--scheduler)")
            if not opts["user"]:
                raise CommandError("--user is required for a user token")
            found = users.filter(username=opts["user"]).first()
            if found is None:
                raise CommandError(f"no user {opts['user']!r}")
            user = found
            kind = ApiToken.Kind.USER
        token, key = ApiToken.issue(user, opts["name"], kind=kind, cluster=cluster)
        where = f" for cluster {cluster}" if cluster else ""
        self.stderr.write(f"{token.kind} token {token.name!r} ({token.prefix}…) of {user}{where}; key:")
        self.stdout.write(key)
