"""Settings, read once from the environment; every default works on one machine."""

import sys
from datetime import timedelta
from pathlib import Path

import dj_database_url
import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
STATE_DIR = BASE_DIR / ".veri"


class Env(environ.Env):
    """django-environ, with three of its conveniences off so that every setting means what it
    did when it was parsed by hand: a value starting with `$` is that value (not a reference to
    another variable: a generated SECRET_KEY may start with one), an empty value is "" (not
    None), a boolean is true for 1/true/yes/on only, and a float is Python's float() (not
    stripped of all but digits)."""

    BOOLEAN_TRUE_STRINGS = ("1", "true", "yes", "on")

    def get_value(self, var, cast=None, default=environ.Env.NOTSET, parse_default=False):
        value = self.ENVIRON.get(f"{self.prefix}{var}")
        if isinstance(value, str) and (value == "" or value.startswith("$")):
            return self.parse_value(value, cast)
        return super().get_value(var, cast=cast, default=default, parse_default=parse_default)

    @classmethod
    def parse_value(cls, value, cast):
        if cast is bool and isinstance(value, str):
            return value.strip().lower() in cls.BOOLEAN_TRUE_STRINGS
        if cast is float and isinstance(value, str):
            return float(value)
        return super().parse_value(value, cast)


env = Env()

DEBUG = env.bool("DEBUG", default=False)
# The embedded default keeps a generated key under .veri/; production must set SECRET_KEY.
SECRET_KEY = env.str("SECRET_KEY", default=None)
if not SECRET_KEY:
    if env.bool("VERI_PRODUCTION", default=False):
        raise ImproperlyConfigured("SECRET_KEY must be set in production (VERI_PRODUCTION=1).")
    key_file = STATE_DIR / "secret_key"
    if not key_file.exists():
        import secrets

        STATE_DIR.mkdir(parents=True, exist_ok=True)
        key_file.write_text(secrets.token_urlsafe(50))
    SECRET_KEY = key_file.read_text().strip()

ALLOWED_HOSTS = (
    env.str("ALLOWED_HOSTS", default=None) or "127.0.0.1,localhost,testserver,[::1]"
).split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    # before django.contrib.staticfiles and django_q: its `runserver` and `qcluster` are the ones
    "config",
    "django.contrib.staticfiles",
    "csp",
    "axes",  # sign-in throttling (config/signin.py)
    "rest_framework",
    "drf_spectacular",
    "django_q",
    "veri",
    "volumes",
    "training",
    "billing",
    "providers",
    "serving",
    "openai_api",
    "tinker_api",
    "webhooks",
    "dashboard",
]

MIDDLEWARE = [
    "veri.middleware.QueryCountMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "config.staticfiles.StaticFilesMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "openai_api.middleware.OpenAIErrorsMiddleware",
    "veri.middleware.ApiGuardMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a lockout into the sign-in page saying so
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

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
            ]
        },
    }
]

DATABASE_URL = env.str("DATABASE_URL", default=None) or f"sqlite:///{STATE_DIR / 'db.sqlite3'}"
try:
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL,
            # Seconds a web or task process keeps its connection (0: one per request); a kept one
            # is checked before each request, so a restarted database costs no failed request.
            conn_max_age=env.int("VERI_DB_CONN_MAX_AGE", default=0),
            conn_health_checks=True,
        )
    }
except ValueError as exc:  # an unknown scheme
    raise ImproperlyConfigured(f"DATABASE_URL {DATABASE_URL!r}: {exc}") from None
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # The qcluster and the web server write at once: wait for the lock instead of failing.
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}
    # A file, not memory, so that end-to-end tests' subprocesses (qcluster, worker) share it.
    DATABASES["default"]["TEST"] = {"NAME": str(STATE_DIR / "test-db.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = ["config.signin.SignInThrottle", "veri.auth.EmailBackend"]
# Sign-in throttling (django-axes, see config/signin.py): failures per account and per address.
VERI_SIGNIN_FAILURE_LIMIT = env.int("VERI_SIGNIN_FAILURE_LIMIT", default=5)
VERI_SIGNIN_LOCKOUT_MINUTES = env.int("VERI_SIGNIN_LOCKOUT_MINUTES", default=15)
# Proxies in front of the web processes that append the client's address to X-Forwarded-For
# (0: clients connect directly, and the header is the client's to forge).
VERI_TRUSTED_PROXY_COUNT = env.int("VERI_TRUSTED_PROXY_COUNT", default=0)
AXES_FAILURE_LIMIT = VERI_SIGNIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=VERI_SIGNIN_LOCKOUT_MINUTES)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = False  # its reset goes by address too: one's own sign-in would clear others
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_USERNAME_CALLABLE = "config.signin.username_of"
AXES_CLIENT_IP_CALLABLE = "config.signin.client_ip"
AXES_LOCKOUT_CALLABLE = "config.signin.locked_out"
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "csrfmiddlewaretoken"]
# A production deployment is served over HTTPS: its session and CSRF cookies never travel in clear.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("VERI_PRODUCTION", default=False)
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Content-Security-Policy on every page, the dashboard's and the admin's: scripts and styles
# only from this origin's static files (no inline script, handler or style anywhere: a template
# test keeps it so), fetches to this origin; forms post here, or on to Stripe Checkout (top-up).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'", "https://checkout.stripe.com"],
    }
}

STATIC_URL = "static/"
STATIC_ROOT = STATE_DIR / "static"
# The admin's CSS and JS are served by the app itself (DEBUG is off by default); from the apps'
# folders directly, so no collectstatic step is needed on one machine.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # WhiteNoise warns on every request without it

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["veri.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": [
        "veri.parsers.SafeJSONParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "veri.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Veri API",
    "DESCRIPTION": "Managed LLM training: volumes, datasets, training jobs, billing.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "ENUM_NAME_OVERRIDES": {"EvaluationStatusEnum": "serving.models.EvaluationStatus"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "config.schema.add_error_responses",
    ],
}

# The task broker: the database by default, Redis when VERI_REDIS_URL is set (production: several
# qcluster processes share its queue). Work the broker loses is re-queued from the database.
VERI_REDIS_URL = env.str("VERI_REDIS_URL", default=None)
VERI_Q_TIMEOUT_SECONDS = env.int("VERI_Q_TIMEOUT_SECONDS", default=600)
Q_CLUSTER = {
    "name": "veri",
    **({"redis": VERI_REDIS_URL} if VERI_REDIS_URL else {"orm": "default"}),
    "workers": env.int("VERI_Q_WORKERS", default=3),  # one is taken by the watchdog loop
    "timeout": VERI_Q_TIMEOUT_SECONDS,
    "retry": VERI_Q_TIMEOUT_SECONDS + 120,  # past the timeout, or a long task is handed out twice
    "max_attempts": 3,
    "catch_up": False,
    # The database broker's wait between looks at an empty queue (Redis's waits on the queue).
    "poll": env.float("VERI_Q_POLL_SECONDS", default=0.5),
    "ack_failures": True,
}

# The task cluster says what it does (started, its schedules, each job launched or settled).
VERI_CLUSTER_LOG_LEVEL = env.str("VERI_CLUSTER_LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("VERI_LOG_LEVEL", default="WARNING")},
    "loggers": {
        name: {"level": VERI_CLUSTER_LOG_LEVEL}
        for name in ("config.management.commands.qcluster", "training.tasks")
    },
}

# Veri
VERI_STORE = env.str("VERI_STORE", default=None) or f"file://{STATE_DIR / 'store'}"
AWS_ENDPOINT_URL = env.str("AWS_ENDPOINT_URL", default=None)
AWS_REGION = (
    env.str("AWS_REGION", default=None)
    or env.str("AWS_DEFAULT_REGION", default=None)
    or "us-east-1"
)
# The role the control plane assumes (STS) to hand workers credentials scoped to one volume's
# prefix (S3 store only). Unset: the store has no STS (Runpod's, many MinIO setups), and workers
# get a presigned GET URL per file instead, with the same lifetime.
VERI_STS_ROLE_ARN = env.str("VERI_STS_ROLE_ARN", default="")
# The KMS key a bucket's objects are encrypted with (SSE-KMS): scoped credentials may use it
# through S3 (kms:Decrypt to read; kms:GenerateDataKey too to write), that key and no other.
VERI_STORE_KMS_KEY_ARN = env.str("VERI_STORE_KMS_KEY_ARN", default="")
VERI_MULTIPART_THRESHOLD = env.int("VERI_MULTIPART_THRESHOLD", default=5 * 1024**3)
VERI_MULTIPART_PART_SIZE = env.int("VERI_MULTIPART_PART_SIZE", default=64 * 1024**2)
VERI_PRESIGN_TTL_SECONDS = env.int("VERI_PRESIGN_TTL_SECONDS", default=3600)
VERI_DEFAULT_REGION = env.str("VERI_DEFAULT_REGION", default="us-east-1")
VERI_STALE_UPLOAD_SECONDS = env.int("VERI_STALE_UPLOAD_SECONDS", default=24 * 3600)
# A JSON body's limit (a 500-file upload batch is ~0.5 MB, a worker's log batch at most ~1 MB).
VERI_MAX_JSON_BYTES = env.int("VERI_MAX_JSON_BYTES", default=4 * 1024**2)
DATA_UPLOAD_MAX_MEMORY_SIZE = VERI_MAX_JSON_BYTES
# Veri-Db-Queries on responses
VERI_QUERY_COUNT_HEADER = env.bool("VERI_QUERY_COUNT_HEADER", default=False)
VERI_IDEMPOTENCY_WAIT_SECONDS = env.float("VERI_IDEMPOTENCY_WAIT_SECONDS", default=10.0)
VERI_IDEMPOTENCY_STALE_SECONDS = env.int("VERI_IDEMPOTENCY_STALE_SECONDS", default=600)
VERI_IDEMPOTENCY_KEEP_SECONDS = env.int("VERI_IDEMPOTENCY_KEEP_SECONDS", default=24 * 3600)

# Training and providers
# What workers call back.
VERI_PUBLIC_URL = env.str("VERI_PUBLIC_URL", default="http://127.0.0.1:8000")
# How workers log a job's W&B integration: "online" (to W&B, with the workspace's WANDB_API_KEY
# secret) or "offline" (files under the job's work folder only; no key needed: tests, and a
# deployment that cannot reach W&B).
VERI_WANDB_MODE = env.str("VERI_WANDB_MODE", default="online")
if VERI_WANDB_MODE not in ("online", "offline"):
    raise ImproperlyConfigured("VERI_WANDB_MODE is online or offline.")
VERI_DATASET_MAX_BYTES = env.int("VERI_DATASET_MAX_BYTES", default=100 * 1024**2)
# The OpenAI-compatible face: the base models `GET /v1/models` lists as trainable here, and the
# GPU a fine-tuning job gets unless it asks (`extra_body={"veri": {"gpu_type": ...}}`).
VERI_BASE_MODELS = env.list(
    "VERI_BASE_MODELS",
    default=["Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen3-0.6B"],
)
VERI_OPENAI_GPU_TYPE = env.str("VERI_OPENAI_GPU_TYPE", default="cpu")
VERI_DEFAULT_PROVIDER = env.str("VERI_DEFAULT_PROVIDER", default=None)
# Which providers this deployment offers (VERI_PROVIDERS=local,aws), and their adapters.
KNOWN_PROVIDER_ADAPTERS = {
    "local": "providers.local.LocalProvider",
    "aws": "providers.aws.AwsProvider",
    "digitalocean": "providers.digitalocean.DigitalOceanProvider",
    "vast": "providers.vast.VastProvider",
    "gcp": "providers.gcp.GcpProvider",
}
VERI_PROVIDERS = [
    p.strip() for p in (env.str("VERI_PROVIDERS", default=None) or "local").split(",") if p.strip()
]
if unknown := set(VERI_PROVIDERS) - set(KNOWN_PROVIDER_ADAPTERS):
    raise ImproperlyConfigured(
        f"VERI_PROVIDERS names unknown providers {sorted(unknown)}; known: "
        f"{', '.join(KNOWN_PROVIDER_ADAPTERS)}."
    )
VERI_PROVIDER_ADAPTERS = {name: KNOWN_PROVIDER_ADAPTERS[name] for name in VERI_PROVIDERS}
# Unset: AWS's Deep Learning AMI, looked up per region.
VERI_AWS_AMI_ID = env.str("VERI_AWS_AMI_ID", default=None)
VERI_AWS_DISK_GB = env.int("VERI_AWS_DISK_GB", default=200)
DIGITALOCEAN_TOKEN = env.str("DIGITALOCEAN_TOKEN", default=None)
VERI_DIGITALOCEAN_API_URL = (
    env.str("VERI_DIGITALOCEAN_API_URL", default=None) or "https://api.digitalocean.com"
)
VAST_API_KEY = env.str("VAST_API_KEY", default=None)
VERI_VAST_API_URL = env.str("VERI_VAST_API_URL", default=None) or "https://console.vast.ai"
VERI_VAST_IMAGE = (
    env.str("VERI_VAST_IMAGE", default=None) or "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
)
VERI_VAST_DISK_GB = env.int("VERI_VAST_DISK_GB", default=100)
VERI_GCP_PROJECT = env.str("VERI_GCP_PROJECT", default=None)
GOOGLE_APPLICATION_CREDENTIALS = env.str("GOOGLE_APPLICATION_CREDENTIALS", default=None)
VERI_GCP_API_URL = env.str("VERI_GCP_API_URL", default=None)
VERI_GCP_IMAGE = env.str("VERI_GCP_IMAGE", default=None) or (
    "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
)
VERI_GCP_DISK_GB = env.int("VERI_GCP_DISK_GB", default=200)
VERI_GCP_MAX_GPUS = env.int("VERI_GCP_MAX_GPUS", default=1)  # Flex-start's GPUs at once
# A rented machine installs the worker this control plane serves (providers/worker_dist.py) into
# a Python of this version, with the wheelhouse stored for it. Optional mirror overrides: a
# package to install instead (VERI_WORKER_PACKAGE, e.g. `veri[worker]==0.1.0`) and the index to
# take it, or the dependencies when no wheelhouse can be fetched, from (VERI_WORKER_INDEX_URL);
# VERI_WORKER_PYTHON_MIRROR: where uv downloads a Python when the image has none of that version.
VERI_WORKER_PYTHON = env.str("VERI_WORKER_PYTHON", default=None) or "3.11"
VERI_WORKER_PACKAGE = env.str("VERI_WORKER_PACKAGE", default=None)
VERI_WORKER_INDEX_URL = env.str("VERI_WORKER_INDEX_URL", default=None)
VERI_WORKER_PYTHON_MIRROR = env.str("VERI_WORKER_PYTHON_MIRROR", default=None)
VERI_LOCAL_PRICE_PER_HOUR = env.str("VERI_LOCAL_PRICE_PER_HOUR", default="0.10")
VERI_LOCAL_SLOTS = env.int("VERI_LOCAL_SLOTS", default=1)
VERI_LOCAL_INSTANCES_DIR = env.str("VERI_LOCAL_INSTANCES_DIR", default=None) or str(
    STATE_DIR / "instances"
)
# Local workers are offline unless HF_HUB_OFFLINE is set to a false value; then a hub id must
# already be in this machine's Hugging Face cache.
hub_offline = env.str("HF_HUB_OFFLINE", default=None) or "1"
VERI_LOCAL_HUB_OFFLINE = hub_offline.strip().lower() not in {"0", "false", "no"}
VERI_LOCAL_HF_CACHE = (
    env.str("HF_HUB_CACHE", default=None)
    or (f"{hf_home}/hub" if (hf_home := env.str("HF_HOME", default=None)) else None)
    or str(Path.home() / ".cache" / "huggingface" / "hub")
)
VERI_LOCAL_WORKER_COMMAND = (
    env.str("VERI_LOCAL_WORKER_COMMAND", default=None) or f"{sys.executable} -m worker"
).split()
# A launch that has not recorded its machine by then is taken for dead (its task worker killed):
# the machine is adopted if the provider has one tagged with the job, else the launch is retried.
VERI_LAUNCH_STALL_SECONDS = env.int("VERI_LAUNCH_STALL_SECONDS", default=120)
# An ended job not settled (charged, refunded) this long after it ended is settled again.
VERI_SETTLE_RETRY_SECONDS = env.int("VERI_SETTLE_RETRY_SECONDS", default=60)
VERI_PROVISIONING_TIMEOUT_SECONDS = env.int("VERI_PROVISIONING_TIMEOUT_SECONDS", default=900)
# A local worker that has not registered by then cannot reach VERI_PUBLIC_URL (it retries ~2 min).
VERI_LOCAL_REGISTER_TIMEOUT_SECONDS = env.int("VERI_LOCAL_REGISTER_TIMEOUT_SECONDS", default=150)
VERI_CONFIGURING_TIMEOUT_SECONDS = env.int("VERI_CONFIGURING_TIMEOUT_SECONDS", default=1800)
VERI_WORKER_SILENT_SECONDS = env.int("VERI_WORKER_SILENT_SECONDS", default=900)
# The most a training worker waits between heartbeats (a tenth of its job's heartbeat timeout,
# 5 to 30 s): a pause or budget stop reaches it with the next one. Tests shorten it, so a job
# waiting for its stop does not train on for half a minute.
VERI_WORKER_HEARTBEAT_MAX_SECONDS = env.int("VERI_WORKER_HEARTBEAT_MAX_SECONDS", default=30)
# A multi-GPU job making no step for the longer of this and three times its median step time,
# its worker still answering, is training_stalled.
VERI_STALL_SECONDS = env.int("VERI_STALL_SECONDS", default=600)
# Serving (deployments): the GPU type a deployment gets when it names none; how long an inference
# request for a model that is starting waits before answering 503 + Retry-After; a replica's
# heartbeat period, silence and start deadlines; how long a replica may take to answer.
VERI_SERVING_GPU_TYPE = env.str("VERI_SERVING_GPU_TYPE", default="cpu")
VERI_SERVING_WAIT_SECONDS = env.float("VERI_SERVING_WAIT_SECONDS", default=5.0)
VERI_SERVING_READ_TIMEOUT_SECONDS = env.float("VERI_SERVING_READ_TIMEOUT_SECONDS", default=300.0)
VERI_REPLICA_HEARTBEAT_SECONDS = env.int("VERI_REPLICA_HEARTBEAT_SECONDS", default=15)
VERI_REPLICA_SILENT_SECONDS = env.int("VERI_REPLICA_SILENT_SECONDS", default=120)
VERI_REPLICA_START_TIMEOUT_SECONDS = env.int("VERI_REPLICA_START_TIMEOUT_SECONDS", default=900)
# The vLLM a replica on a rented GPU machine serves with (its bootstrap installs exactly this, in
# a virtualenv of its own beside the worker's): the one place its version is pinned.
VERI_VLLM_REQUIREMENT = env.str("VERI_VLLM_REQUIREMENT", default=None) or "vllm==0.34.0"
# How the router reaches a replica on a rented machine: the sources its serving port is opened to
# (the control plane's egress addresses; every replica also requires its serving key), and
# whether to use the machine's private address (the control plane shares the provider's network)
# rather than its public one.
VERI_SERVING_ALLOWED_CIDR = env.str("VERI_SERVING_ALLOWED_CIDR", default="0.0.0.0/0")
VERI_SERVING_PRIVATE_NETWORK = env.bool("VERI_SERVING_PRIVATE_NETWORK", default=False)
VERI_DEPLOYMENT_CHARGE_SECONDS = env.int("VERI_DEPLOYMENT_CHARGE_SECONDS", default=3600)
# Scaling up: a deployment gets another replica (up to its max_replicas) once its in-flight
# requests (queued and running) per ready replica stay over the target for the window.
VERI_SERVING_TARGET_INFLIGHT = env.int("VERI_SERVING_TARGET_INFLIGHT", default=4)
VERI_SERVING_SCALE_WINDOW_SECONDS = env.float("VERI_SERVING_SCALE_WINDOW_SECONDS", default=30.0)
# Each workspace's inference rate limits (an operator overrides them per workspace in the admin).
VERI_RATE_LIMIT_REQUESTS_PER_MINUTE = env.int("VERI_RATE_LIMIT_REQUESTS_PER_MINUTE", default=600)
VERI_RATE_LIMIT_TOKENS_PER_MINUTE = env.int("VERI_RATE_LIMIT_TOKENS_PER_MINUTE", default=1_000_000)
VERI_LOG_ARCHIVE_SECONDS = env.int("VERI_LOG_ARCHIVE_SECONDS", default=10)
# A job's whole log, in bytes: past it, lines are dropped (one marker line says so).
VERI_MAX_LOG_BYTES = env.int("VERI_MAX_LOG_BYTES", default=100 * 1024**2)
# How often every provider is asked for machines tagged as ours whose job has ended.
VERI_SWEEP_SECONDS = env.int("VERI_SWEEP_SECONDS", default=300)
VERI_WATCH_PERIOD_SECONDS = env.float("VERI_WATCH_PERIOD_SECONDS", default=5.0)
STRIPE_SECRET_KEY = env.str("STRIPE_SECRET_KEY", default="")
STRIPE_WEBHOOK_SECRET = env.str("STRIPE_WEBHOOK_SECRET", default="")
STRIPE_API_BASE = env.str("STRIPE_API_BASE", default="")  # tests: a fake; empty: Stripe's own
# Names this deployment in what it sends to Stripe (idempotency keys, metadata), so that two
# databases sharing one Stripe account never collide; empty: an id generated once and kept in the
# database (set it when a database is restored or cloned next to the one it came from).
STRIPE_DEPLOYMENT_ID = env.str("STRIPE_DEPLOYMENT_ID", default="")
# Stripe keeps an idempotency key's first answer (a 500 included) for at least a day: a balance
# transaction it answered 500 is looked up, then re-sent under a new key, only after this.
STRIPE_IDEMPOTENCY_WINDOW_SECONDS = env.int("STRIPE_IDEMPOTENCY_WINDOW_SECONDS", default=86400)
# Per Stripe request (connect and read); a request path waits for at most three of them.
STRIPE_TIMEOUT_SECONDS = env.float("STRIPE_TIMEOUT_SECONDS", default=15.0)
VERI_STORAGE_PRICE_PER_GIB_MONTH = env.str("VERI_STORAGE_PRICE_PER_GIB_MONTH", default="0.07")
VERI_STOP_GRACE_SECONDS = env.int("VERI_STOP_GRACE_SECONDS", default=120)
VERI_BALANCE_GRACE_SECONDS = env.int("VERI_BALANCE_GRACE_SECONDS", default=300)
# GRPO alarms (job events): the reward flat for N steps, KL past a threshold and rising,
# every sampled completion of N sampled steps the same.
VERI_ALARM_FLAT_STEPS = env.int("VERI_ALARM_FLAT_STEPS", default=20)
VERI_ALARM_FLAT_SPREAD = env.float("VERI_ALARM_FLAT_SPREAD", default=0.000001)
VERI_ALARM_KL_MAX = env.float("VERI_ALARM_KL_MAX", default=1.0)
VERI_ALARM_COLLAPSED_STEPS = env.int("VERI_ALARM_COLLAPSED_STEPS", default=3)
# A job token's lifetime; the worker's runner renews its token halfway through, and the token it
# renewed with keeps working for the overlap (requests already on their way), then dies.
VERI_JOB_TOKEN_TTL_SECONDS = env.int("VERI_JOB_TOKEN_TTL_SECONDS", default=14 * 24 * 3600)
VERI_JOB_TOKEN_OVERLAP_SECONDS = env.int("VERI_JOB_TOKEN_OVERLAP_SECONDS", default=600)

# Webhooks (webhooks/): endpoints on loopback or private networks receive deliveries only where
# this is on; it is on unless VERI_PRODUCTION is set, so that one machine can post to itself, and
# off in production, where such a URL would let a customer reach the control plane's own network.
VERI_WEBHOOKS_ALLOW_PRIVATE = env.bool(
    "VERI_WEBHOOKS_ALLOW_PRIVATE", default=not env.bool("VERI_PRODUCTION", default=False)
)
# Seconds one delivery attempt may take to connect, send, and read the answer's first bytes.
VERI_WEBHOOKS_TIMEOUT_SECONDS = env.float("VERI_WEBHOOKS_TIMEOUT_SECONDS", default=10.0)
# Wall-clock seconds a grader may take to score one sample on the control plane (`graders/run`,
# evaluations); past it the sample scores 0 with the grader's timeout error.
VERI_GRADER_TIMEOUT_SECONDS = env.float("VERI_GRADER_TIMEOUT_SECONDS", default=10.0)
# The Tinker face (tinker_api): where a training client's worker runs; how long a session may go
# without the client's heartbeat (it sends one every 10 s) before it ends with its models; how
# long a future's retrieve or a worker's poll waits for an answer, and how often it looks.
VERI_TINKER_PROVIDER = env.str("VERI_TINKER_PROVIDER", default="local")
VERI_TINKER_GPU_TYPE = env.str("VERI_TINKER_GPU_TYPE", default="cpu")
VERI_TINKER_SESSION_TIMEOUT_SECONDS = env.int("VERI_TINKER_SESSION_TIMEOUT_SECONDS", default=120)
VERI_TINKER_WAIT_SECONDS = env.float("VERI_TINKER_WAIT_SECONDS", default=20.0)
VERI_TINKER_POLL_INTERVAL_SECONDS = env.float("VERI_TINKER_POLL_INTERVAL_SECONDS", default=0.1)
# A model's uptime is charged at least this often while it runs (and when it ends).
VERI_TINKER_CHARGE_SECONDS = env.int("VERI_TINKER_CHARGE_SECONDS", default=120)
# A session's budget cap when its client names none (`user_metadata={"veri_max_cost_usd": ...}`).
VERI_TINKER_SESSION_MAX_COST_USD = env.str("VERI_TINKER_SESSION_MAX_COST_USD", default="100")
# How long a model ending with its state saved may take to save before it ends unsaved.
VERI_TINKER_SAVE_TIMEOUT_SECONDS = env.int("VERI_TINKER_SAVE_TIMEOUT_SECONDS", default=600)
