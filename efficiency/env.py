"""Typed environment-variable helpers that fail loudly.

Every setting the service reads from the environment goes through one of these, so a typo such as
``DEBUG=ture`` or ``TARGET_MFU=45`` stops the process at start-up with a message naming the variable,
instead of running with a silently wrong value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvError(ValueError):
    """A configuration variable is missing or malformed."""


#: Every variable this process read from its real environment, in the order read: name -> whether it was
#: set (non-blank). The staff settings page lists them with their effective values (jobs.views.settings_page).
READS: dict[str, bool] = {}

#: Names whose values are secrets: shown as "set" / "not set", never as a value.
_SECRET_NAME = re.compile(r"SECRET|PASSWORD|TOKEN|(?<![A-Z])KEY(?![A-Z])|_KEY|CREDENTIAL", re.IGNORECASE)


def _raw(name: str, env: Mapping[str, str] | None) -> str | None:
    source = os.environ if env is None else env
    value = source.get(name)
    if env is None:
        READS[name] = value is not None and value.strip() != ""
    return None if value is None else value.strip()


@dataclass(frozen=True)
class EffectiveSetting:
    """One environment variable as the staff settings page shows it."""

    name: str
    value: str
    source: str  # "environment" or "default"
    secret: bool


def mask(name: str, value: object) -> tuple[str, bool]:
    """`value` as it may be shown: a secret name's value hidden, a URL's password replaced by ***."""
    if _SECRET_NAME.search(name):
        return ("set (hidden)" if value not in (None, "", [], ()) else "not set"), True
    text = ", ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    parts = urlsplit(text) if "://" in text else None
    if parts is not None and parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return text.replace(parts.netloc, netloc, 1), True
    return text, False


def effective_settings(
    reads: Mapping[str, bool], lookup: Mapping[str, object], environ: Mapping[str, str]
) -> list[EffectiveSetting]:
    """The variables read at start-up (`reads`), each with the value in force: the Django setting of the
    same name when there is one (`lookup`), else the raw environment value, else "default"; sorted by name.
    Secrets are masked (`mask`)."""
    rows = []
    for name in sorted(reads):
        if name in lookup:
            value: object = lookup[name]
        elif reads[name]:
            value = environ.get(name, "")
        else:
            value = "(default: see README, Configuration)"
        shown, secret = mask(name, value)
        rows.append(EffectiveSetting(name, shown, "environment" if reads[name] else "default", secret))
    return rows


def env_str(name: str, default: str | None = None, *, env: Mapping[str, str] | None = None) -> str:
    """A string variable; without a default the variable is required."""
    value = _raw(name, env)
    if value is None or value == "":
        if default is None:
            raise EnvError(f"{name} is required but not set")
        return default
    return value


def env_bool(name: str, default: bool, *, env: Mapping[str, str] | None = None) -> bool:
    """A boolean: 1/true/yes/on or 0/false/no/off (case-insensitive); anything else is an error."""
    value = _raw(name, env)
    if value is None:
        return default
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise EnvError(f"{name}={value!r} is not a boolean (use true/false, 1/0, yes/no, on/off)")


def env_int(
    name: str,
    default: int,
    *,
    min_value: int | None = None,
    max_value: int | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """An integer within optional bounds."""
    value = _raw(name, env)
    if value is None or value == "":
        return default
    try:
        parsed = int(value)
    except ValueError:
        raise EnvError(f"{name}={value!r} is not an integer") from None
    _check_bounds(name, parsed, min_value, max_value)
    return parsed


def env_float(
    name: str,
    default: float,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    env: Mapping[str, str] | None = None,
) -> float:
    """A finite float within optional bounds."""
    value = _raw(name, env)
    if value is None or value == "":
        return default
    try:
        parsed = float(value)
    except ValueError:
        raise EnvError(f"{name}={value!r} is not a number") from None
    if parsed != parsed or parsed in (float("inf"), float("-inf")):
        raise EnvError(f"{name}={value!r} must be a finite number")
    _check_bounds(name, parsed, min_value, max_value)
    return parsed


def _check_bounds(name: str, value: float, lo: float | None, hi: float | None) -> None:
    if lo is not None and value < lo:
        raise EnvError(f"{name}={value} is below the minimum {lo}")
    if hi is not None and value > hi:
        raise EnvError(f"{name}={value} is above the maximum {hi}")


def env_list(name: str, default: list[str], *, env: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated list; blanks dropped."""
    value = _raw(name, env)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


#: Prometheus' own scrape-job label and its renamed copy: they name the scrape target (the exporter), not a
#: workload, so a selector on them reads every GPU the exporter reports (issue 23).
SCRAPE_JOB_LABELS = ("job", "exported_job")


def env_job_labels(name: str, default: list[str], *, env: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated list of job-identity label names (valid Prometheus label names), never the scrape
    `job` label or `exported_job` (SCRAPE_JOB_LABELS); an empty list is an error (members could then
    register no selector at all, which is a configuration mistake, not a policy)."""
    labels = env_list(name, default, env=env)
    if not labels:
        raise EnvError(f"{name} is empty; list the exporter's job-identity labels, e.g. hpc_job,pod")
    for label in labels:
        if not _LABEL.fullmatch(label):
            raise EnvError(f"{name}: {label!r} is not a valid Prometheus label name")
        if label in SCRAPE_JOB_LABELS:
            raise EnvError(
                f"{name} names {label!r}, Prometheus' scrape-job label: it names the exporter, not a job, so "
                "a selector on it would read every GPU; use the exporter's job label (e.g. hpc_job, pod)"
            )
    return labels


_HOST_NAME = re.compile(r"(?=.{1,253}\.?$)((?!-)[a-z0-9_-]{1,63}(?<!-)\.)*(?!-)[a-z0-9_-]{1,63}(?<!-)\.?")


def env_hosts(name: str, default: list[str], *, env: Mapping[str, str] | None = None) -> list[str]:
    """A comma-separated list of host names, IP addresses and CIDR networks (``hooks.internal,10.0.0.0/8,
    ::1``), lowercased; a malformed entry is an error (an allow-list typo must not pass silently)."""
    import ipaddress

    hosts = [item.lower() for item in env_list(name, default, env=env)]
    for host in hosts:
        try:
            ipaddress.ip_network(host.strip("[]"), strict=False)
            continue
        except ValueError:
            pass
        if "/" in host or ":" in host or not _HOST_NAME.fullmatch(host):
            raise EnvError(f"{name}: {host!r} is not a host name, an IP address or a CIDR network")
    return hosts


def env_choice(
    name: str, default: str, choices: tuple[str, ...], *, env: Mapping[str, str] | None = None
) -> str:
    """One of a fixed set of values."""
    value = env_str(name, default, env=env)
    if value not in choices:
        raise EnvError(f"{name}={value!r} must be one of: {', '.join(choices)}")
    return value


def env_url(
    name: str, default: str, *, schemes: tuple[str, ...], env: Mapping[str, str] | None = None
) -> str:
    """A URL with one of the given schemes and a host."""
    value = env_str(name, default, env=env)
    parts = urlsplit(value)
    if parts.scheme not in schemes or not parts.netloc:
        raise EnvError(f"{name}={value!r} must be a URL like {schemes[0]}://host:port/...")
    return value.rstrip("/") if parts.scheme in ("http", "https") else value


@dataclass(frozen=True)
class DatabaseConfig:
    """Connection settings parsed from a postgres:// URL."""

    name: str
    user: str
    password: str
    host: str
    port: int | None
    options: dict[str, str]

    def as_django(self) -> dict[str, object]:
        """The ``DATABASES['default']`` dict for Django's postgresql backend."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.name,
            "USER": self.user,
            "PASSWORD": self.password,
            "HOST": self.host,
            "PORT": str(self.port) if self.port else "",
            "OPTIONS": dict(self.options),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }


def parse_database_url(url: str, *, name: str = "DATABASE_URL") -> DatabaseConfig:
    """Parse ``postgres://user:pass@host:port/db?sslmode=...``; a socket dir may be given as ``?host=/x``."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise EnvError(
            f"{name} must start with postgres:// (got scheme {parts.scheme!r}); only PostgreSQL is supported"
        )
    db = unquote(parts.path.lstrip("/"))
    if not db:
        raise EnvError(f"{name} has no database name (postgres://user:pass@host:5432/DBNAME)")
    try:
        port = parts.port
    except ValueError:
        raise EnvError(f"{name} has an invalid port") from None
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    host = query.pop("host", None) or unquote(parts.hostname or "")
    return DatabaseConfig(
        name=db,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        host=host,
        port=port,
        options=query,
    )
