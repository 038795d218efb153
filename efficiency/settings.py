"""Django settings, read from environment variables through the typed helpers in ``efficiency.env``.

Defaults work for a local checkout (`make demo`, `make test`): services on loopback, on the ports the
Makefile starts them on. Production sets at least SECRET_KEY, DEBUG=false, ALLOWED_HOSTS and the URLs.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from kombu import Queue

from efficiency.env import (
    env_bool,
    env_choice,
    env_float,
    env_hosts,
    env_int,
    env_job_labels,
    env_list,
    env_str,
    env_url,
    parse_database_url,
)
from efficiency.queues import QueueName
from efficiency.queues import routes as queue_routes
from efficiency.sso_config import load_sso_config

BASE_DIR = Path(__file__).resolve().parent.parent

# False unless set: a process started without DEBUG runs like a deployment (SECRET_KEY required, HTTPS-only
# cookies, HSTS). Development sets DEBUG=true (the Makefile's dev targets, efficiency/settings_test.py).
DEBUG = env_bool("DEBUG", False)
_DEV_SECRET = "dev-only-insecure-key-do-not-use-in-production-0123456789abcdefghijklmnop"
SECRET_KEY = env_str("SECRET_KEY", _DEV_SECRET if DEBUG else None)
if not DEBUG and SECRET_KEY == _DEV_SECRET:
    from efficiency.env import EnvError

    raise EnvError("SECRET_KEY must be set to a private value when DEBUG is false")
# Earlier SECRET_KEYs, still accepted for signatures and for opening sealed alert secrets while rotating.
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])
# Fernet keys for webhook URLs and secrets at rest (jobs.alerts.secrets): the first seals, all open. Empty:
# keys derived from SECRET_KEY and SECRET_KEY_FALLBACKS.
ALERT_SECRET_KEYS = env_list("ALERT_SECRET_KEYS", [])
for _key in ALERT_SECRET_KEYS:
    try:
        from cryptography.fernet import Fernet

        Fernet(_key.encode())
    except ValueError:
        from efficiency.env import EnvError

        raise EnvError(
            "ALERT_SECRET_KEYS: an entry is not a Fernet key (32 url-safe base64 bytes; make one with "
            'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())")'
        ) from None
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
SITE_URL = env_url("SITE_URL", "http://127.0.0.1:8000", schemes=("http", "https"))

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "axes",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # Before anything that reads a body (CSRF reads POST bodies): size caps, upload login/team checks.
    "efficiency.middleware.RequestLimitsMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "efficiency.middleware.ContentSecurityPolicyMiddleware",
    "efficiency.middleware.LoginRequiredMiddleware",
    "efficiency.middleware.ApiErrorMiddleware",
    # Last, as django-axes requires: turns a locked-out login into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "efficiency.urls"
WSGI_APPLICATION = "efficiency.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": parse_database_url(
        env_str("DATABASE_URL", "postgres://efficiency:efficiency@127.0.0.1:55432/efficiency")
    ).as_django()
}
# Lets concurrent test runs on one server use separate test databases.
DATABASES["default"]["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "test_efficiency")}
# A persistent connection (CONN_MAX_AGE) is checked with `SELECT 1` before its first query of a request, so
# one that Postgres or the network dropped while idle is replaced instead of failing that request with a 500.
# Measured (issue 26 item 4): 0.03-0.05 ms of our CPU and 0.05-0.15 ms wall per request against the job
# page's ~24 ms of CPU; kept on. Off saves that round trip and costs one failed request per dropped
# connection (Django then closes it at the request's end).
DATABASES["default"]["CONN_HEALTH_CHECKS"] = env_bool("DB_CONN_HEALTH_CHECKS", True)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "job-list"
LOGOUT_REDIRECT_URL = "login"
# Single sign-on (OpenID Connect through mozilla-django-oidc, jobs/sso/; README "Single sign-on"): off unless
# OIDC_ENABLED=true, and then complete or the process does not start. SsoBackend declines every login
# while SSO is off; local accounts always log in through ModelBackend.
SSO = load_sso_config()
# django-axes (below) neither counts nor locks the SSO callback: it is no password guess.
AXES_WHITELIST_CALLABLE = "jobs.sso.views.not_a_password_login"
# Login throttling (django-axes) first: a locked-out username + address is refused before any backend.
AUTHENTICATION_BACKENDS = [
    "jobs.access.login_throttle.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
    "jobs.sso.backend.SsoBackend",
]
AXES_ENABLED = env_bool("AXES_ENABLED", True)
# Failed password logins of one username from one address before both are locked out, for the cool-off.
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, min_value=1, max_value=1000)
AXES_COOLOFF_TIME = timedelta(
    minutes=env_float("AXES_COOLOFF_MINUTES", 15.0, min_value=0.1, max_value=10_080)
)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/lockout.html"
AXES_HTTP_RESPONSE_CODE = 429
# Behind a TLS proxy the client address is X-Forwarded-For's first entry, else every user shares one.
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ("HTTP_X_FORWARDED_FOR", "REMOTE_ADDR") if env_bool("BEHIND_TLS_PROXY", False) else ("REMOTE_ADDR",)
)

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(BASE_DIR / "var" / "staticfiles")))
STORAGES: dict[str, dict[str, object]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
MEDIA_ROOT = Path(env_str("MEDIA_ROOT", str(BASE_DIR / "var" / "media")))
# Artifact blobs (content-addressed: artifacts/ab/cd/<sha256>) live in STORAGES["artifacts"]: the local
# filesystem under MEDIA_ROOT by default, or an S3-compatible object store (AWS S3, MinIO, Ceph RGW...) so
# that workers on other machines can parse them. Empty keys/region: boto3's own chain (IAM role, AWS_* vars).
ARTIFACT_STORAGE = env_choice("ARTIFACT_STORAGE", "local", ("local", "s3"))
if ARTIFACT_STORAGE == "s3":
    STORAGES["artifacts"] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": env_str("ARTIFACT_S3_BUCKET"),
            "endpoint_url": env_str("ARTIFACT_S3_ENDPOINT_URL", "") or None,
            "access_key": env_str("ARTIFACT_S3_ACCESS_KEY_ID", "") or None,
            "secret_key": env_str("ARTIFACT_S3_SECRET_ACCESS_KEY", "") or None,
            "region_name": env_str("ARTIFACT_S3_REGION", "") or None,
            "location": env_str("ARTIFACT_S3_PREFIX", ""),
            # Blobs are named by their sha256: the same name is the same bytes, so overwriting is safe.
            "file_overwrite": True,
            # Reads through storage.open() spool to disk past 16 MiB instead of holding a trace in memory.
            "max_memory_size": 16 * 1024 * 1024,
        },
    }
else:
    STORAGES["artifacts"] = {"BACKEND": "django.core.files.storage.FileSystemStorage"}  # at MEDIA_ROOT
MEDIA_URL = "/media/"  # never routed: artifacts are served through a view, as attachments

# Uploads: artifacts can be large traces; Django streams anything above the memory limit to disk.
ARTIFACT_MAX_BYTES = env_int("ARTIFACT_MAX_BYTES", 512 * 1024 * 1024, min_value=1024)
# A Kineto trace needs about 3x its JSON size in memory while parsing: 1 GiB of JSON ~ 3 GiB per worker.
ARTIFACT_MAX_DECOMPRESSED_BYTES = env_int("ARTIFACT_MAX_DECOMPRESSED_BYTES", 1024**3, min_value=1024)
# Parsing: wall-clock budget per parse (Celery soft time limit; the hard limit is 60 s later, and the
# sweep fails artifacts left "parsing" past both), and how many starts a parse gets before it fails
# (redeliveries after a lost worker, e.g. one killed for memory, count).
ARTIFACT_PARSE_BUDGET_S = env_int("ARTIFACT_PARSE_BUDGET_S", 900, min_value=10, max_value=86400)
ARTIFACT_MAX_PARSE_ATTEMPTS = env_int("ARTIFACT_MAX_PARSE_ATTEMPTS", 3, min_value=1, max_value=20)
# Largest non-file request body (JSON, forms; also the request-size cap of every URL but the uploads).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int(
    "DATA_UPLOAD_MAX_MEMORY_SIZE", 10 * 1024 * 1024, min_value=64 * 1024, max_value=1024**3
)
# Uploaded files up to this size stay in memory; larger ones are streamed to FILE_UPLOAD_TEMP_DIR.
FILE_UPLOAD_MAX_MEMORY_SIZE = env_int(
    "FILE_UPLOAD_MAX_MEMORY_SIZE", 10 * 1024 * 1024, min_value=0, max_value=1024**3
)
FILE_UPLOAD_TEMP_DIR = env_str("FILE_UPLOAD_TEMP_DIR", "") or None
# Registered jobs: a window (start to end, or to now while running) longer than this is refused, so a
# typo in started_at cannot make ingestion poll years of samples.
MAX_JOB_WINDOW_DAYS = env_int("MAX_JOB_WINDOW_DAYS", 90, min_value=1, max_value=3660)
# A job registered (or re-opened) as still running may have started at most this many days ago: a running
# job's window is polled to now, so an old start on a running job re-reads weeks of samples every cycle.
# 30 days is longer than any scheduler's usual time limit (Slurm sites cap MaxTime at days to weeks);
# longer runs are chained jobs, each registered on its own.
MAX_RUNNING_JOB_DAYS = env_int("MAX_RUNNING_JOB_DAYS", 30, min_value=1, max_value=3660)
# The most GPUs one registration may list explicitly ("gpus"): a list is compared with every running
# job's GPUs at registration and turned into PromQL matchers on each poll.
MAX_JOB_GPUS = env_int("MAX_JOB_GPUS", 1024, min_value=1, max_value=100_000)
# GPUs the platform declares time-sliced (shared by several jobs by design, e.g. the NVIDIA device
# plugin's time-slicing config): "host/index" or UUID patterns with * and ? ("node-t*/*"). Only on these
# (and on MIG instances the exporter labels) is a GPU's cost split between overlapping jobs, and may a
# member register GPUs another team's running job holds (jobs.access.ownership).
TIME_SLICED_GPUS = env_list("TIME_SLICED_GPUS", [])

# Services
REDIS_URL = env_url("REDIS_URL", "redis://127.0.0.1:56379/0", schemes=("redis", "rediss", "unix"))
# One cache for web and worker processes (the poll cycle's summary for /metrics, axes' lockouts): Redis,
# under its own key prefix so it never meets Celery's keys in the same database.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": env_url("CACHE_URL", REDIS_URL, schemes=("redis", "rediss", "unix")),
        "KEY_PREFIX": env_str("CACHE_KEY_PREFIX", "efficiency"),
        "TIMEOUT": 300,
    }
}
# The job page's rendered bodies kept in each web process's memory (jobs.views.job_page_cache), keyed by
# the version of what they show: a warm 256-GPU page is ~0.7 MiB (issue 26 item 4). 0 renders every view.
JOB_PAGE_CACHE_MIB = env_int("JOB_PAGE_CACHE_MIB", 64, min_value=0, max_value=65_536)
PROMETHEUS_URL = env_url("PROMETHEUS_URL", "http://127.0.0.1:59090", schemes=("http", "https"))
PROMETHEUS_TIMEOUT_S = env_float("PROMETHEUS_TIMEOUT_S", 10.0, min_value=0.1, max_value=300)
# /healthz asks Prometheus with this short timeout and no retries, so a slow Prometheus cannot hold a
# web worker (the check reports it as down instead).
HEALTHZ_PROMETHEUS_TIMEOUT_S = env_float("HEALTHZ_PROMETHEUS_TIMEOUT_S", 2.0, min_value=0.1, max_value=30)
PROMETHEUS_RETRIES = env_int("PROMETHEUS_RETRIES", 3, min_value=0, max_value=10)
# Ask Prometheus for gzip-compressed answers. Off: compressing is Prometheus' CPU (a finalize's 7.7 MB
# per-series answer: 0.53-0.59 CPU-s gzipped, 0.19-0.20 plain, #26 item 6) and saves only bandwidth; turn
# it on when Prometheus is across a slow link.
PROMETHEUS_COMPRESSION = env_bool("PROMETHEUS_COMPRESSION", False)
# Range queries a finalize keeps in flight (jobs.metrics.ingest.read_finalize): Prometheus evaluates one
# query per core, so a finalize that sends them one after another leaves all but one of its cores idle
# (#26 item 6: a 256-GPU x 3-day job, 114 range queries). 1 = one after another.
FINALIZE_QUERY_CONCURRENCY = env_int("FINALIZE_QUERY_CONCURRENCY", 4, min_value=1, max_value=64)
# Per-GPU archive rows at the polled step (300 s) are kept this long after their last value; their
# downsampled copies (1800 s and 21,600 s, jobs.metrics.archive.GPU_TIERS) and all cross-GPU stats stay.
ARCHIVE_RAW_RETENTION_DAYS = env_int("ARCHIVE_RAW_RETENTION_DAYS", 30, min_value=1, max_value=36600)
# dcgm-exporter's scrape interval: coverage = samples / (window / interval), and rate() windows hold >= 2
# intervals. 30 s as in efficiency/deploy/prometheus.yml (Prometheus' own default is 1 m; sampling.md).
PROMETHEUS_SCRAPE_INTERVAL_S = env_float("PROMETHEUS_SCRAPE_INTERVAL_S", 30.0, min_value=1.0, max_value=600)
# A poll never advances a job's data_until past now minus this lag (samples still in flight: remote write,
# a replica behind), so late data is re-read by the next poll. Default two scrape intervals (#13 item 6).
PROMETHEUS_INGESTION_LAG_S = env_float(
    "PROMETHEUS_INGESTION_LAG_S", 2 * PROMETHEUS_SCRAPE_INTERVAL_S, min_value=0.0, max_value=3600
)
# The label of node_exporter's series that holds the node name matching dcgm-exporter's Hostname
# (`instance` for host:port targets, or a relabelled `nodename`/`Hostname`); empty = host signals are not
# read (jobs.metrics.host_signals). Off by default: each per-job read costs 1 + 9 more queries.
NODE_EXPORTER_HOST_LABEL = env_str("NODE_EXPORTER_HOST_LABEL", "")

# Organisation defaults (editable per job / baseline; see reference/formulas.md).
# Reference MFU per dtype family, each a fraction of THAT dtype's dense peak (an FP8 job is measured against
# the FP8 peak, which is 2x the BF16 one, so the same hardware efficiency reads as a lower MFU).
# BF16/FP16/TF32/FP32: formulas.md, well-run large training 40-55 % -> 45 %. FP8: NVIDIA's Llama-2-70B FP8
# recipe reaches ~38 % of the FP8 dense peak on H100 (NeMo performance summary, quoted in issue #11).
TARGET_MFU = env_float("TARGET_MFU", 0.45, min_value=0.01, max_value=1.0)
TARGET_MFU_FP8 = env_float("TARGET_MFU_FP8", 0.38, min_value=0.01, max_value=1.0)
# The organisation's one FLOPs convention for MFU: "palm" = 6N + 12·L·H·Q·T (PaLM appendix B, the default,
# formulas.md) or "6n" = 6N. Jobs without the shape "palm" needs are computed as 6N and marked as fallbacks.
MFU_FLOPS_CONVENTION = env_choice("MFU_FLOPS_CONVENTION", "palm", ("palm", "6n"))
PRICE_TIERS = ("on_demand", "reserved", "spot", "on_prem")
DEFAULT_PRICE_TIER = env_choice("DEFAULT_PRICE_TIER", "on_demand", PRICE_TIERS)
# Job discovery from exporter labels (e.g. hpc_job, pod); empty turns it off. New jobs go to this team.
DISCOVERY_LABEL = env_str("DISCOVERY_LABEL", "")
DISCOVERY_TEAM = env_str("DISCOVERY_TEAM", "unassigned")
# What discovered jobs are taken to be (training, fine_tuning, inference, unknown): serving clusters set
# inference; unknown shows no kind-specific cause above info (jobs.diagnosis.kinds).
DISCOVERY_JOB_KIND = env_choice(
    "DISCOVERY_JOB_KIND", "training", ("training", "fine_tuning", "inference", "unknown")
)
# Bearer token Prometheus must send to scrape /metrics. Without one /metrics answers 403, unless
# METRICS_PUBLIC=true opens it on purpose (the demo on loopback): job names and costs are not public data.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", False)
# Read policy (jobs.access.permissions): "team" = members read their teams' jobs, findings, artifacts, costs,
# baselines and alerts (staff read all; other teams only as leaderboard aggregates); "all" = everyone does.
READ_SCOPE = env_choice("READ_SCOPE", "team", ("team", "all"))
# throughput_query templates (jobs.metrics.throughput): the longest range a template may read ([5m] in
# rate(...[5m]), a subquery's range), and the Prometheus timeout of the throughput query.
THROUGHPUT_MAX_LOOKBACK_S = env_int("THROUGHPUT_MAX_LOOKBACK_S", 3600, min_value=60, max_value=86400)
THROUGHPUT_QUERY_TIMEOUT_S = env_float("THROUGHPUT_QUERY_TIMEOUT_S", 5.0, min_value=0.5, max_value=120.0)
# The label `$job` matches in a throughput template: `$job` becomes THROUGHPUT_JOB_LABEL="<external id>".
THROUGHPUT_JOB_LABEL = env_str("THROUGHPUT_JOB_LABEL", "job_id")
# A member's job selector must match its job label exactly (no regex): one of these label names, the
# exporter's job-identity labels. Never Prometheus' scrape `job` label (nor `exported_job`): it names the
# exporter, so {"job": "<exporter>"} reads every GPU; env_job_labels refuses them.
SELECTOR_JOB_LABELS = env_job_labels(
    "SELECTOR_JOB_LABELS", ["job_id", "hpc_job", "slurm_job_id", "pod", "exported_pod"]
)
# Grafana with efficiency/deploy/grafana-dashboard.json imported: job pages link to it (empty: no link).
GRAFANA_URL = env_url("GRAFANA_URL", "", schemes=("http", "https")) if env_str("GRAFANA_URL", "") else ""
# Demo only: where `load_demo` keeps the running demo jobs; enables the simulated dcgm-exporter endpoint.
DEMO_STATE_DIR = env_str("DEMO_STATE_DIR", "")
ENERGY_USD_PER_KWH = env_float("ENERGY_USD_PER_KWH", 0.0, min_value=0.0, max_value=10.0)
# A job wasting at least this many USD per day that no rule explains gets an `unexplained_waste` finding
# (what the signals show, what is missing, what to capture): the page is never silent beside real money.
UNEXPLAINED_WASTE_MIN_USD_PER_DAY = env_float(
    "UNEXPLAINED_WASTE_MIN_USD_PER_DAY", 50.0, min_value=0.0, max_value=1_000_000.0
)

# Alert rules (jobs.alerts): evaluated after each poll of a running job; each has a threshold and a minimum
# duration in minutes the condition must hold before an incident opens (it resolves when it clears).
ALERTS_ENABLED = env_bool("ALERTS_ENABLED", True)
# GPUs idle: at least this many allocated GPUs at idle GPU_UTIL (the evaluation's <= 5 %) for N minutes.
ALERT_IDLE_MIN_GPUS = env_int("ALERT_IDLE_MIN_GPUS", 1, min_value=1)
ALERT_IDLE_MINUTES = env_float("ALERT_IDLE_MINUTES", 15.0, min_value=0.0, max_value=10_080.0)
# MFU below its baseline band, or (no baseline) below this share of the reference MFU, for N minutes.
ALERT_MFU_REFERENCE_SHARE = env_float("ALERT_MFU_REFERENCE_SHARE", 0.7, min_value=0.0, max_value=1.0)
ALERT_MFU_MINUTES = env_float("ALERT_MFU_MINUTES", 30.0, min_value=0.0, max_value=10_080.0)
# Throttling: busy GPUs' SM clock below this share of the max boost clock (or violation counters above
# THROTTLE_REASON_SHARE), for N minutes.
ALERT_THROTTLE_CLOCK_RATIO = env_float("ALERT_THROTTLE_CLOCK_RATIO", 0.85, min_value=0.0, max_value=1.0)
ALERT_THROTTLE_MINUTES = env_float("ALERT_THROTTLE_MINUTES", 10.0, min_value=0.0, max_value=10_080.0)
# XID errors: at least this many GPUs reporting an XID code; open at once, resolved after N quiet minutes.
ALERT_XID_MIN_GPUS = env_int("ALERT_XID_MIN_GPUS", 1, min_value=1)
ALERT_XID_MINUTES = env_float("ALERT_XID_MINUTES", 15.0, min_value=0.0, max_value=10_080.0)
# Straggler: the diagnosis' straggler finding with at least this confidence, for N minutes.
ALERT_STRAGGLER_MIN_CONFIDENCE = env_float(
    "ALERT_STRAGGLER_MIN_CONFIDENCE", 0.5, min_value=0.0, max_value=1.0
)
ALERT_STRAGGLER_MINUTES = env_float("ALERT_STRAGGLER_MINUTES", 10.0, min_value=0.0, max_value=10_080.0)
# A finding whose waste exceeds this many USD/day, for N minutes.
ALERT_WASTE_USD_PER_DAY = env_float("ALERT_WASTE_USD_PER_DAY", 500.0, min_value=0.0, max_value=1e9)
ALERT_WASTE_MINUTES = env_float("ALERT_WASTE_MINUTES", 10.0, min_value=0.0, max_value=10_080.0)
# Ingestion stale: no new data archived for this many minutes while the job runs.
ALERT_STALE_MINUTES = env_float("ALERT_STALE_MINUTES", 10.0, min_value=1.0, max_value=10_080.0)
# Notifications: attempts per delivery (exponential backoff from ALERT_RETRY_BACKOFF_S), HTTP timeout, and
# the age after which a claimed delivery belongs to a dead worker and is sent again.
ALERT_DELIVERY_MAX_ATTEMPTS = env_int("ALERT_DELIVERY_MAX_ATTEMPTS", 6, min_value=1, max_value=50)
ALERT_RETRY_BACKOFF_S = env_float("ALERT_RETRY_BACKOFF_S", 30.0, min_value=0.0, max_value=3600.0)
ALERT_WEBHOOK_TIMEOUT_S = env_float("ALERT_WEBHOOK_TIMEOUT_S", 10.0, min_value=0.1, max_value=120.0)
ALERT_STALE_CLAIM_S = env_float("ALERT_STALE_CLAIM_S", 600.0, min_value=1.0, max_value=3000.0)
# Outbound requests to webhook URLs (jobs.alerts.outbound): a host resolving to any internal address
# (loopback, private, link-local, unique-local, ...) is refused unless listed here (host names, IP
# addresses, CIDR networks); at most this many bytes of a reply are read, then dropped (status code only).
ALERT_ALLOWED_HOSTS = env_hosts("ALERT_ALLOWED_HOSTS", [])
ALERT_WEBHOOK_MAX_RESPONSE_BYTES = env_int(
    "ALERT_WEBHOOK_MAX_RESPONSE_BYTES", 64 * 1024, min_value=0, max_value=10 * 1024 * 1024
)
# The poll cycle's Redis lock: held with this TTL and renewed by a heartbeat every third of it while the
# cycle runs, so a killed worker frees it within the TTL (jobs.runtime.locks). A poller whose last completed
# cycle
# is older than POLL_STALLED_AFTER_S marks the service degraded (/healthz, /metrics) and holds the
# ingestion_stale alerts, which would otherwise fire for every job (jobs.runtime.service_health).
POLL_CYCLE_LOCK_TTL_S = env_int("POLL_CYCLE_LOCK_TTL_S", 90, min_value=3, max_value=600)
POLL_STALLED_AFTER_S = env_float("POLL_STALLED_AFTER_S", 150.0, min_value=10.0, max_value=86_400.0)
# Sharding the poll cycle (#26 item 1, jobs.pipeline.poll): after the cluster-wide read, each batch of
# POLL_SHARD_JOBS jobs' evaluation, diagnosis and alert rules runs as a `poll_shard` task on the poll queue
# (0: in the cycle's process, one worker). A shard's inputs wait in the cache for POLL_SHARD_TTL_S (a shard
# redelivered later re-reads its jobs); the cycle waits at most POLL_SHARD_WAIT_S for its shards.
POLL_SHARD_JOBS = env_int("POLL_SHARD_JOBS", 0, min_value=0, max_value=100_000)
POLL_SHARD_TTL_S = env_int("POLL_SHARD_TTL_S", 900, min_value=60, max_value=86_400)
POLL_SHARD_WAIT_S = env_float("POLL_SHARD_WAIT_S", 300.0, min_value=1.0, max_value=3_600.0)
# Idle-GPU policy (jobs.alerts.policy): only teams listed here may have jobs cancelled, only when the team
# enabled its policy; IDLE_POLICY_DRY_RUN=true logs every action without doing it, whatever the team says.
IDLE_POLICY_TEAMS = env_list("IDLE_POLICY_TEAMS", [])
IDLE_POLICY_DRY_RUN = env_bool("IDLE_POLICY_DRY_RUN", False)
# Command hook: run with the job's external id and its selector's labels in the environment (no shell).
IDLE_POLICY_COMMAND = env_str("IDLE_POLICY_COMMAND", "")
IDLE_POLICY_COMMAND_TIMEOUT_S = env_float("IDLE_POLICY_COMMAND_TIMEOUT_S", 30.0, min_value=1.0, max_value=600)
# Kubernetes: API server URL and a service-account token file (RBAC: delete pods in the job's namespace).
IDLE_POLICY_K8S_API = env_str("IDLE_POLICY_K8S_API", "")
IDLE_POLICY_K8S_TOKEN_FILE = env_str(
    "IDLE_POLICY_K8S_TOKEN_FILE", "/var/run/secrets/kubernetes.io/serviceaccount/token"
)
IDLE_POLICY_K8S_CA_FILE = env_str(
    "IDLE_POLICY_K8S_CA_FILE", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

# Celery
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TIMEZONE = TIME_ZONE
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
# Named queues (README "Workers and queues"); a worker started without -Q consumes all of them. Each kind
# of work has its own so that a 15-minute parse or a slow webhook never delays the one-minute polls.
CELERY_TASK_DEFAULT_QUEUE = str(QueueName.DEFAULT)
CELERY_TASK_QUEUES = tuple(Queue(str(name)) for name in QueueName)
# From efficiency.queues.TASK_QUEUES; any task not listed there (a new one) goes to the default queue.
CELERY_TASK_ROUTES = queue_routes()
# Beat keeps its schedule in Redis and holds a Redis lock (celery-redbeat), so a second beat started by
# mistake (or as a standby) waits instead of sending every periodic task twice. The lock expires
# REDBEAT_LOCK_TIMEOUT_S after the holder stops renewing it (it renews every tick, at most 5 s apart).
CELERY_BEAT_SCHEDULER = "redbeat.RedBeatScheduler"
CELERY_BEAT_MAX_LOOP_INTERVAL = 5
CELERY_REDBEAT_REDIS_URL = env_url(
    "REDBEAT_REDIS_URL", REDIS_URL, schemes=("redis", "rediss", "unix", "redis-sentinel", "redis-cluster")
)
CELERY_REDBEAT_REDIS_OPTIONS: dict[str, object] = {}
CELERY_REDBEAT_KEY_PREFIX = env_str("REDBEAT_KEY_PREFIX", "efficiency:redbeat:")
CELERY_REDBEAT_LOCK_TIMEOUT = env_int("REDBEAT_LOCK_TIMEOUT_S", 60, min_value=15, max_value=3600)
WEEKLY_REPORT_CRON = env_str("WEEKLY_REPORT_CRON", "0 8 * * 1")

# Email
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = env_int("EMAIL_PORT", 1025, min_value=1, max_value=65535)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 20, min_value=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "efficiency <efficiency@localhost>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL

# REST API
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "jobs.api.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "jobs.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    # JSON with a depth limit and no NUL/control characters/lone surrogates; uploads are multipart.
    "DEFAULT_PARSER_CLASSES": [
        "jobs.api.parsers.SafeJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    # Unexpected exceptions become a JSON 500 with an error id that is logged with the traceback.
    "EXCEPTION_HANDLER": "jobs.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "efficiency API",
    "DESCRIPTION": "Register GPU training jobs, push progress, upload profiling artifacts, read MFU, "
    "cost and findings. Authenticate with `Authorization: Token <key>`.",
    # Redoc prints the version in brackets after the title: "v1" reads as a version, "1" as a count.
    "VERSION": "v1",
    "SERVE_INCLUDE_SCHEMA": False,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "jobs.api.schema.add_summaries",
    ],
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "REDOC_DIST": "SIDECAR",
    # Job and artifact both have a `kind` field with different choices: name their enums apart.
    "ENUM_NAME_OVERRIDES": {
        "JobKindEnum": "jobs.models.Job.Kind",
        "ArtifactKindEnum": "jobs.models.Artifact.Kind",
    },
}

# Security headers; the production-only ones switch on with DEBUG=false.
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# Sessions are read from the cache (Redis, CACHES above) and written through to the database: every page
# read its session row from Postgres before (issue 26 item 4). Still server-side, so logout and a flush
# end a session at once (both delete the cache entry and the row); signed-cookie sessions could not be
# revoked. A cache miss (eviction, Redis restarted empty) falls back to the row.
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, min_value=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("BEHIND_TLS_PROXY", False) else None
if SECURE_HSTS_PRELOAD is False and not DEBUG:
    SILENCED_SYSTEM_CHECKS = ["security.W021"]  # preload is an explicit opt-in, not a default

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
]
