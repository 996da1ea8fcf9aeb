"""Settings. Everything that varies between machines comes from the environment, read here only."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from config.broker import RABBITMQ_DEFAULT_CONSUMER_TIMEOUT, broker_config
from config.env import envbool, envfloat, envint, envjson, envlist, envstr

# Django's classes that the type stubs make generic (ModelAdmin, ModelForm, ...) accept their type
# arguments at run time too, as the code writes them: `class RunAdmin(admin.ModelAdmin[WorkflowRun])`.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = envbool("DEBUG", False)
# SECRET_KEY signs sessions, CSRF tokens and password-reset links: whoever knows it can forge them.
# It also keys the webhook body digests and replay keys (webhooks.services.body_digest, replay_key).
# The development default is public, so without DEBUG the process refuses to start rather than
# use it (scripts/run.sh generates a key into var/, the tests set their own).
INSECURE_SECRET_KEY = "insecure-development-key-change-me"
SECRET_KEY = envstr("SECRET_KEY", "") or (INSECURE_SECRET_KEY if DEBUG else "")
if not DEBUG and (SECRET_KEY in ("", INSECURE_SECRET_KEY) or SECRET_KEY.startswith("django-insecure-")):
    raise ImproperlyConfigured(
        "SECRET_KEY is unset or a publicly known development key, and DEBUG is off. Set SECRET_KEY in "
        "the environment to a long random value kept secret, e.g. "
        "SECRET_KEY=\"$(python -c 'import secrets; print(secrets.token_urlsafe(50))')\", "
        "or set DEBUG=1 on a development machine (scripts/run.sh does both for you)."
    )
if not DEBUG and len(SECRET_KEY) < 32:
    raise ImproperlyConfigured(
        f"SECRET_KEY is too short ({len(SECRET_KEY)} characters; at least 32), and DEBUG is off: a short key "
        "can be guessed. Use a long random value, e.g. "
        "SECRET_KEY=\"$(python -c 'import secrets; print(secrets.token_urlsafe(50))')\"."
    )
# Behind HTTPS (a proxy terminating TLS and setting X-Forwarded-Proto), HTTPS=1 turns on what
# `manage.py check --deploy` asks for: cookies only over HTTPS, a redirect from http, HSTS.
HTTPS = envbool("HTTPS", False)
if HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 3600)
    # Off unless asked: both reach beyond this site (every subdomain; browsers' preload lists, which
    # take months to leave). `check --deploy` warns until they are on (security.W005, W021).
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)
    # Probes and Prometheus call the process itself over http (no proxy, no X-Forwarded-Proto).
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

# --- The examples (examples/): optional ------------------------------------------------------------
# The demo, the refund and the supplier-assessment apps show the engine at work: their tables, admin
# pages, API routes and workflows exist only where INSTALL_EXAMPLES is on. The run and test commands
# turn it on (the demo's data, the sandbox payment provider and the suite need them); a production
# project leaves it off. Every process of one deployment (web, workers, beat, manage.py) needs the
# same value: a worker without the examples fails their runs as unknown workflows.
INSTALL_EXAMPLES = envbool("INSTALL_EXAMPLES", False)
EXAMPLE_APPS = ["examples.demo", "examples.refunds", "examples.suppliers"]

# daphne's app is only what makes `manage.py runserver` serve the ASGI application (WebSockets
# included); the web server itself is `daphne config.asgi:application`. The app imports Twisted and
# installs its reactor in whichever process loads it: a quarter of a second at each start of a
# worker, beat or command, which have no use for it. So only runserver loads it.
DEV_SERVER_APPS = ["daphne"] if sys.argv[1:2] == ["runserver"] else []

INSTALLED_APPS = [
    *DEV_SERVER_APPS,
    "config.apps.AdminConfig",  # django.contrib.admin, with the project's site (config/admin.py)
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI assets served locally: /api/docs/ works offline
    "channels",
    "workflows",
    "ledger",
    "approvals",
    "accounts",
    "agents",
    "webhooks",  # signed inbound events; above agents, below the examples
    "schedules",  # recurring runs and submissions fired by beat; beside webhooks, below the examples
    *(EXAMPLE_APPS if INSTALL_EXAMPLES else []),
    "ops",  # /healthz, /readyz, /metrics and the JSON log format; beside portal, reads the core apps
    "portal",  # the pages a signed-in person sees; may read every app listed above
]

MIDDLEWARE = [
    "ops.middleware.RequestMetrics",  # first: it times everything after it (/metrics)
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"
# An open WebSocket checks again what it checked when it connected (the session still signed in,
# the user active, still allowed to see the run or agent): before each client message, and before
# a push at most this often. Signed out, deactivated or removed from the account: closed by then.
WEBSOCKET_RECHECK_SECONDS = envfloat("WEBSOCKET_RECHECK_SECONDS", 30.0)
# Messages a WebSocket client may send a second, in bursts of up to twice as many; one past that is
# answered with an error frame and not read (0: no limit). Each message is re-checked against the
# database (above): a client sending as fast as its connection goes would keep a server busy.
WEBSOCKET_MAX_FRAMES_PER_SECOND = envfloat("WEBSOCKET_MAX_FRAMES_PER_SECOND", 10.0)

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

# The embedded default is an SQLite file; DATABASE_URL=postgres://... selects PostgreSQL,
# the production database and the one the test suite runs on.
DATABASES = {
    "default": dj_database_url.parse(
        envstr("DATABASE_URL", f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}"),
        conn_max_age=envint("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=envbool("DATABASE_CONN_HEALTH_CHECKS", True),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and envbool("DATABASE_POOL", False):
    # A pool of connections per process (psycopg_pool), for the ASGI server (config/asgi.py sets
    # DATABASE_POOL): each visit of a consumer or view to the ORM borrows one instead of opening its
    # own (a connection costs PostgreSQL a process; a reconnecting chat paid for one per read), and a
    # burst of sockets waits for the pool instead of taking every connection PostgreSQL has.
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django requires it with a pool: the pool keeps them
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = envbool("DATABASE_POOL_CHECKS", True)
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": envint("DATABASE_POOL_MIN_SIZE", 2),
        "max_size": envint("DATABASE_POOL_MAX_SIZE", 10),
        "timeout": envfloat("DATABASE_POOL_TIMEOUT", 10.0),
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, worker, beat) share the file: wait for locks instead of failing.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-gb"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# The ASGI app serves static files itself; turn off behind a web server that serves STATIC_ROOT.
SERVE_STATIC = envbool("SERVE_STATIC", True)
# Threads an ASGI server process serves HTTP requests' Django code in (config/handlers.py): the
# requests in progress at once beyond it wait. Python runs one thread of a process at a time, so
# more threads only overlap requests' waits (the database, Redis) and share the one interpreter
# among more requests at once, each slower: at 500 webhooks a second on two cores, 4 threads
# answered with a p99 of 30 ms where 16 took 65 (docs/inbound-performance.md). Raise it where
# requests wait long on something (a distant database); above DATABASE_POOL_MAX_SIZE they would
# wait for a connection anyway.
ASGI_REQUEST_THREADS = envint("ASGI_REQUEST_THREADS", 4)
# The largest request body the ASGI server accepts, in bytes (config/server.py): a larger one is
# answered 413 before it is read. 10 MiB, the most a webhook source may accept (max_body_bytes).
HTTP_MAX_BODY_BYTES = envint("HTTP_MAX_BODY_BYTES", 10 * 1024 * 1024)
# Customers and staff sign in at /accounts/login/ (portal); the admin keeps its own login for staff.
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# Failed sign-ins (both forms) are counted in Redis, each count for a window from its first failure;
# a count at its limit refuses the attempts it covers (429) until its window ends, the right password
# too (accounts/signin.py). 0 turns a count off.
SIGNIN_WINDOW_SECONDS = envint("SIGNIN_WINDOW_SECONDS", 900)
SIGNIN_MAX_FAILURES_PER_NAME_AND_ADDRESS = envint("SIGNIN_MAX_FAILURES_PER_NAME_AND_ADDRESS", 10)
SIGNIN_MAX_FAILURES_PER_ADDRESS = envint("SIGNIN_MAX_FAILURES_PER_ADDRESS", 100)
SIGNIN_MAX_FAILURES_PER_NAME = envint("SIGNIN_MAX_FAILURES_PER_NAME", 50)
SIGNIN_KEY_PREFIX = envstr("SIGNIN_KEY_PREFIX", "signin")
# Behind proxies, the header they write the client's address in (X-Forwarded-For), and how many of
# them append to it: the address used is that many from its end, the one the farthest proxy added
# (any before it the client may have written). Empty: the connection's address.
CLIENT_ADDRESS_HEADER = envstr("CLIENT_ADDRESS_HEADER", "")
CLIENT_ADDRESS_PROXIES = envint("CLIENT_ADDRESS_PROXIES", 1)

REDIS_URL = envstr("REDIS_URL", "redis://127.0.0.1:6379/0")

# --- Celery: at-least-once delivery (docs/architecture.md#execution) ----------------------------
# The broker: Redis (REDIS_URL) unless CELERY_BROKER_URL names another, e.g. RabbitMQ with
# amqp://user:password@host:5672/vhost (quorum queues, publisher confirms; config/broker.py and
# docs/decisions/0020). The channel layer and the progress streams stay on Redis either way.
CELERY_BROKER_URL = envstr("CELERY_BROKER_URL", "") or REDIS_URL
BROKER = broker_config(
    CELERY_BROKER_URL,
    # Redis: longer than the longest a task may run (CELERY_TASK_TIME_LIMIT, below), or Redis would
    # hand an unacknowledged message to a second worker while the first is still running it.
    visibility_timeout=envint("CELERY_VISIBILITY_TIMEOUT", 3 * 3600),
    # RabbitMQ: the consumer_timeout its rabbitmq.conf sets (seconds; RabbitMQ's default is 30 min).
    # It must exceed CELERY_TASK_TIME_LIMIT too (workflows.E006), which this process cannot see.
    consumer_timeout=envint("RABBITMQ_CONSUMER_TIMEOUT", RABBITMQ_DEFAULT_CONSUMER_TIMEOUT),
)
# Seconds a worker may hold a message unacknowledged before the broker takes it back (the system
# checks compare the engine's time limits with it).
BROKER_ACK_TIMEOUT = BROKER.ack_timeout
CELERY_BROKER_TRANSPORT_OPTIONS = BROKER.transport_options
CELERY_TASK_DEFAULT_QUEUE_TYPE = BROKER.queue_type
CELERY_TASK_CREATE_MISSING_QUEUE_TYPE = BROKER.queue_type
CELERY_TASK_DEFAULT_EXCHANGE_TYPE = BROKER.exchange_type
CELERY_TASK_CREATE_MISSING_QUEUE_EXCHANGE_TYPE = BROKER.exchange_type
CELERY_TASK_ACKS_LATE = True  # a message is acknowledged after the task ran, not before
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # a worker holds no more messages than it runs
CELERY_TASK_REJECT_ON_WORKER_LOST = True  # a killed child's message goes back; the recovery cap stops poison
# A worker outlives its broker: it retries connecting at start-up and after losing the connection,
# for as long as the broker is away (Celery's default gives up after 100 tries, and the worker
# exits). A task still running when the connection drops is cancelled, since its message goes back
# to the queue (or is lost with a Redis restart: the sweeper sends its run again).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
CELERY_TASK_IGNORE_RESULT = True
# A step body runs at most WORKFLOWS_MAX_STEP_TIMEOUT (SIGALRM raises StepTimeout in it); one that
# outlives its timeout by WORKFLOWS_STEP_TIMEOUT_GRACE (it swallowed StepTimeout, or is stuck in C
# code with signals blocked) stops having its lease renewed, so another worker process recovers
# the run. One workflows.advance task hands its run back to the queue at the first step boundary
# after WORKFLOWS_TASK_BUDGET. Celery's hard time limit is therefore above budget + longest step
# + grace (a second grace for the engine's own work around the step): past it Celery kills the
# stuck child and starts a new one, so a stuck body cannot hold a worker process for ever.
WORKFLOWS_MAX_STEP_TIMEOUT = envint("WORKFLOWS_MAX_STEP_TIMEOUT", 3600)
WORKFLOWS_STEP_TIMEOUT_GRACE = envfloat("WORKFLOWS_STEP_TIMEOUT_GRACE", 30.0)
WORKFLOWS_TASK_BUDGET = envfloat("WORKFLOWS_TASK_BUDGET", 300.0)
CELERY_TASK_TIME_LIMIT = envint(
    "CELERY_TASK_TIME_LIMIT",
    int(WORKFLOWS_TASK_BUDGET + WORKFLOWS_MAX_STEP_TIMEOUT + 2 * WORKFLOWS_STEP_TIMEOUT_GRACE) + 1,
)
# Celery's Django fix-up closes every database connection before and after each task unless
# DB_REUSE_MAX is set: each run's claim then paid for a new PostgreSQL connection (~10 ms, as much
# as a 20-step run's own work). Workers keep their connections as web requests do instead:
# config/celery.py applies CONN_MAX_AGE and CONN_HEALTH_CHECKS around each task.
CELERY_DB_REUSE_MAX = 2**62
# The queue runs are advanced on (and the sweeper runs on); steps may name others with queue=.
WORKFLOWS_QUEUE = envstr("WORKFLOWS_QUEUE", "celery")
CELERY_TASK_DEFAULT_QUEUE = WORKFLOWS_QUEUE
CELERY_TASK_ALWAYS_EAGER = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Seconds between two ticks of the schedules (README "Schedules"): a schedule fires up to this late.
SCHEDULES_TICK_INTERVAL = envfloat("SCHEDULES_TICK_INTERVAL", 5.0)
# `manage.py schedules purge` deletes firing records due longer ago than this (the schedules stay).
SCHEDULES_RETENTION_DAYS = envint("SCHEDULES_RETENTION_DAYS", 30)
CELERY_BEAT_SCHEDULE = {
    "workflows-sweep": {
        "task": "workflows.sweep",
        "schedule": envfloat("WORKFLOWS_SWEEP_INTERVAL", 1.0),
        "options": {"expires": 30},
    },
    # Pending later actions of webhook deliveries whose task was lost (a broker restart).
    "webhooks-sweep": {"task": "webhooks.sweep", "schedule": 15.0, "options": {"expires": 60}},
    # Submissions accepted into an agent's inbox whose task was lost.
    "agents-sweep-submissions": {"task": "agents.sweep_submissions", "schedule": 15.0, "options": {"expires": 60}},
    # Backstop for approvals left pending by runs that failed or restarted.
    "approvals-sweep": {"task": "approvals.sweep", "schedule": 60.0, "options": {"expires": 120}},
    # Every schedule (schedules app: rows managed in the admin and `manage.py schedules`) fires from
    # this one entry. Ticks from two beats, or a beat restarted, fire each due time once; a tick
    # message that waited past `expires` is dropped, the next one does its work.
    "schedules-tick": {
        "task": "schedules.tick",
        "schedule": SCHEDULES_TICK_INTERVAL,
        "options": {"expires": 30},
    },
}

# --- Channels ---------------------------------------------------------------------------------
# Redis pub/sub: a push to a group is one PUBLISH, and each ASGI process subscribed to the group
# hands it to its own sockets in memory. channels_redis's list layer (RedisChannelLayer) stores one
# copy per socket and each process pops them one round trip at a time: a hundred sockets on one chat
# cost daphne most of a core at 20 chunks a second, and delivery fell seconds behind (bench/chat.py).
# Pub/sub keeps nothing for a socket that is not listening; nothing here needs that: the database is
# the authority, and every socket fills a gap in what it was pushed from it (docs/architecture.md).
# CHANNEL_LAYER_BACKEND=channels_redis.core.RedisChannelLayer selects the list layer; its blocking
# read of 5 s needs the read timeout below, well above it (redis-py 8's default is 5 s).
CHANNEL_LAYER_SOCKET_TIMEOUT = 15.0
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": envstr("CHANNEL_LAYER_BACKEND", "channels_redis.pubsub.RedisPubSubChannelLayer"),
        "CONFIG": {
            "hosts": [
                {"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT, "socket_connect_timeout": 5.0}
            ],
            "prefix": envstr("CHANNELS_PREFIX", "asgi"),
        },
    }
}

# --- REST framework ---------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
        "workflows.apis.authentication.TokenAuthentication",  # DRF's, its read prepared
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["workflows.apis.errors.LimitedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "workflows.apis.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Durable agents and workflows API",
    "DESCRIPTION": 'Start and control durable workflow runs; errors are {"error": {code, message, detail}}.',
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # 3.1: JSON Schema's propertyNames states what the keys of a JSON object field must be.
    "OAS_VERSION": "3.1.0",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "workflows.apis.schema.add_json_value",
        "workflows.apis.schema.add_links",
        "workflows.apis.schema.add_workflow_operations",  # after add_links: copies run_start's
        "workflows.apis.schema.fix_one_of",
    ],
}

# --- The workflow engine ------------------------------------------------------------------------
WORKFLOWS: dict[str, Any] = {
    # Extra modules that define workflows, besides every installed app's workflows.py.
    "MODULES": envlist("WORKFLOWS_MODULES", []),
    # How long a worker's claim on a run lasts without a heartbeat.
    "LEASE_SECONDS": envfloat("WORKFLOWS_LEASE_SECONDS", 30.0),
    # A run whose worker died this many times is failed with reason max_recovery_attempts.
    "MAX_RECOVERY_ATTEMPTS": envint("WORKFLOWS_MAX_RECOVERY_ATTEMPTS", 5),
    # A queued run with no worker after this long is enqueued again (the enqueue was lost).
    "ENQUEUE_GRACE_SECONDS": envfloat("WORKFLOWS_ENQUEUE_GRACE_SECONDS", 30.0),
    "MAX_RESULT_BYTES": envint("WORKFLOWS_MAX_RESULT_BYTES", 1024 * 1024),
    "MAX_PAYLOAD_BYTES": envint("WORKFLOWS_MAX_PAYLOAD_BYTES", 256 * 1024),
    "MAX_STEP_TIMEOUT_SECONDS": WORKFLOWS_MAX_STEP_TIMEOUT,
    # A step body this long past its timeout loses its lease (see CELERY_TASK_TIME_LIMIT above).
    "STEP_TIMEOUT_GRACE_SECONDS": WORKFLOWS_STEP_TIMEOUT_GRACE,
    # A workflows.advance task hands its run back to the queue at the first step boundary after this.
    "TASK_BUDGET_SECONDS": WORKFLOWS_TASK_BUDGET,
    "QUEUE": WORKFLOWS_QUEUE,
    # Runs that customers start over the API (public workflows) advance on this queue: give it
    # workers of its own to keep customer-started work from delaying refunds, assessments and the
    # sweeper. Empty: WORKFLOWS_QUEUE.
    "PUBLIC_QUEUE": envstr("WORKFLOWS_PUBLIC_QUEUE", ""),
    # How many runs one person may have going at once through POST /api/workflows/<name>/runs
    # (queued, running, waiting...: not yet finished); more is a 429. 0: no limit.
    "MAX_ACTIVE_RUNS_PER_OWNER": envint("WORKFLOWS_MAX_ACTIVE_RUNS_PER_OWNER", 10),
    # How many events a run may hold that no step has taken yet; more is a 429 (the app's own
    # events, an approval's decision or a ledger outcome, are never refused). 0: no limit.
    "MAX_WAITING_EVENTS_PER_RUN": envint("WORKFLOWS_MAX_WAITING_EVENTS_PER_RUN", 100),
    "STREAM_TTL_SECONDS": envint("WORKFLOWS_STREAM_TTL", 24 * 3600),
    "STREAM_MAX_EVENTS": envint("WORKFLOWS_STREAM_MAX_EVENTS", 1000),
    # "sync": a step's result is flushed to disk before the next step starts. "async" (PostgreSQL):
    # the step-result commit does not wait for the flush; a worker crash loses nothing, but a
    # PostgreSQL or machine crash may lose the last fraction of a second of step results, and
    # those steps run again (atomic steps stay all-or-nothing; ledger effects stay single).
    "STEP_COMMIT": envstr("WORKFLOWS_STEP_COMMIT", "sync"),
}

# --- The ledger: external side effects and operational records (docs/architecture.md#the-ledger) -
LEDGER: dict[str, Any] = {
    # Per HTTP call to an external system. A connect timeout means nothing was sent (safe to send
    # again); a read timeout means the request may have taken effect (the outcome is unknown).
    "CONNECT_TIMEOUT": envfloat("LEDGER_CONNECT_TIMEOUT", 5.0),
    "READ_TIMEOUT": envfloat("LEDGER_READ_TIMEOUT", 30.0),
    # A submitted operation older than this is no longer in flight (its worker died mid-call):
    # the next perform, `manage.py reconcile` and the admin look it up. Must exceed
    # CONNECT_TIMEOUT + 2 * READ_TIMEOUT (checked at start-up, ledger.E001).
    "STALE_SUBMITTED_SECONDS": envfloat("LEDGER_STALE_SUBMITTED_SECONDS", 120.0),
    # A provider may still be processing a request after our call gave up on it: a lookup's "not
    # found" is believed only once the last send is older than CONNECT_TIMEOUT + 2 * READ_TIMEOUT
    # plus this grace; before that the operation stays unknown and is looked up again later.
    "PROVIDER_GRACE_SECONDS": envfloat("LEDGER_PROVIDER_GRACE_SECONDS", 60.0),
    # An operation a person marked failed after it was sent is looked up again by every reconcile
    # for this many days: if the provider acted on it after all, the ledger says so (see README).
    "RECHECK_RESOLVED_DAYS": envfloat("LEDGER_RECHECK_RESOLVED_DAYS", 7.0),
    # Keys whose values (personal data, credentials) never reach operational records, webhook
    # deliveries or logs, matched case-insensitively at any depth, ignoring "_" and "-" (so
    # cardNumber matches card_number). Whole keys only.
    "REDACT_KEYS": envlist(
        "LEDGER_REDACT_KEYS",
        [
            "address",
            "billing_address",
            "shipping_address",
            "street",
            "postcode",
            "zip",
            "email",
            "phone",
            "phone_number",
            "mobile",
            "card",
            "card_number",
            "pan",
            "cvc",
            "cvv",
            "iban",
            "account_number",
            "sort_code",
            "full_name",
            "first_name",
            "last_name",
            "date_of_birth",
            "dob",
            "ssn",
            "national_id",
            "tax_id",
            # Credentials: a provider's or a webhook's body may carry one, and no record needs it.
            "password",
            "passwd",
            "secret",
            "client_secret",
            "api_key",
            "access_token",
            "refresh_token",
            "private_key",
            "authorization",
        ],
    ),
    # `manage.py purge_records` deletes operational records older than this by default.
    "RETENTION_DAYS": envint("LEDGER_RETENTION_DAYS", 90),
    # Lookups in flight at once during `manage.py reconcile` (they change nothing at the provider).
    "RECONCILE_CONCURRENCY": envint("LEDGER_RECONCILE_CONCURRENCY", 16),
}

# --- Agents: chat turns as durable runs (agents/) -----------------------------------------------
# Extra modules that define agents, besides every installed app's agents.py.
AGENTS_MODULES = envlist("AGENTS_MODULES", [])
# A turn older than this when its run starts (or recovers) a model round is sealed, not answered late.
AGENTS_STALE_TURN_SECONDS = envfloat("AGENTS_STALE_TURN_SECONDS", 3600.0)
# Recoveries of one turn's stream after a crash; past it the turn is sealed with a message saying so.
AGENTS_MAX_RECOVERIES = envint("AGENTS_MAX_RECOVERIES", 3)
# A recovery that finds the stream silent for longer than this is out of budget too (sealed).
AGENTS_MAX_SILENCE_SECONDS = envfloat("AGENTS_MAX_SILENCE_SECONDS", 120.0)
# Model rounds (a model call and the tool calls it asks for) in one turn.
AGENTS_MAX_ROUNDS = envint("AGENTS_MAX_ROUNDS", 8)
AGENTS_MAX_MESSAGE_CHARS = envint("AGENTS_MAX_MESSAGE_CHARS", 4000)
# What a turn gives the model of the conversation: the newest messages, at most this many and this
# many characters of JSON (the turn's own message always); older ones stay stored and shown.
AGENTS_HISTORY_MESSAGES = envint("AGENTS_HISTORY_MESSAGES", 40)
AGENTS_HISTORY_CHARS = envint("AGENTS_HISTORY_CHARS", 200_000)
# Agents one account may have: opening one creates it, so opening ever new names stops here.
AGENTS_MAX_AGENTS_PER_ACCOUNT = envint("AGENTS_MAX_AGENTS_PER_ACCOUNT", 100)
# The Celery queue chat turns' runs advance on (empty: WORKFLOWS_QUEUE). Given workers of its own, a
# chat answers while every process of the main workers waits on a slow provider or a long step.
AGENTS_TURN_QUEUE = envstr("AGENTS_TURN_QUEUE", "")
# Turns one agent may have queued behind its running one; a message beyond it is refused (a 429 over
# HTTP, an error frame on the socket) and stores nothing. 0: no limit.
AGENTS_MAX_QUEUED_TURNS = envint("AGENTS_MAX_QUEUED_TURNS", 5)
# Turns one user may have not yet ended over all their agents (queued, running or waiting); past it a
# message is refused the same way. Bounds what one member takes of the workers from everyone. 0: no limit.
AGENTS_MAX_OPEN_TURNS_PER_USER = envint("AGENTS_MAX_OPEN_TURNS_PER_USER", 10)
# Submissions (POST .../submissions): messages per submission, and pending ones per agent (past it: 429).
AGENTS_MAX_SUBMISSION_MESSAGES = envint("AGENTS_MAX_SUBMISSION_MESSAGES", 20)
AGENTS_MAX_PENDING_SUBMISSIONS = envint("AGENTS_MAX_PENDING_SUBMISSIONS", 100)
# A submission accepted over HTTP waits in its agent's inbox until a worker queues its turn, within
# moments; the sweep (beat, every 15 s) queues one still there after this long (its task was lost).
AGENTS_SUBMISSION_QUEUE_GRACE_SECONDS = envfloat("AGENTS_SUBMISSION_QUEUE_GRACE_SECONDS", 10.0)
# A turn's chunks are stored in batches: at this many, or when this long has passed since the
# last batch, and at the end of each step.
AGENTS_CHUNK_FLUSH_MS = envfloat("AGENTS_CHUNK_FLUSH_MS", 20.0)
AGENTS_CHUNK_FLUSH_COUNT = envint("AGENTS_CHUNK_FLUSH_COUNT", 64)
# `manage.py agents purge-chunks` deletes the streams of turns ended longer ago than this (their
# answers stay, as the turns' text and the conversation's messages).
AGENTS_CHUNK_RETENTION_DAYS = envint("AGENTS_CHUNK_RETENTION_DAYS", 30)
# The embedded `rules` model: seconds before each word it streams (0: as fast as it can).
AGENTS_RULES_WORD_DELAY = envfloat("AGENTS_RULES_WORD_DELAY", 0.0)
# The `openai` model: any OpenAI-compatible server (/chat/completions, streaming).
AGENTS_OPENAI_BASE_URL = envstr("AGENTS_OPENAI_BASE_URL", "")  # e.g. http://127.0.0.1:8000/v1
AGENTS_OPENAI_API_KEY = envstr("AGENTS_OPENAI_API_KEY", "")
AGENTS_OPENAI_MODEL = envstr("AGENTS_OPENAI_MODEL", "")
AGENTS_OPENAI_TIMEOUT = envfloat("AGENTS_OPENAI_TIMEOUT", 30.0)
# Continue a recovered answer with vLLM's continue_final_message; off for servers that refuse it.
AGENTS_OPENAI_CONTINUE_FINAL_MESSAGE = envbool("AGENTS_OPENAI_CONTINUE_FINAL_MESSAGE", True)

# --- Webhooks: signed inbound events (webhooks/; README "Webhooks") ---------------------------
# Each source is a name (its URL: POST /webhooks/<name>/) with a signature scheme (standard, stripe
# or github), its secrets (several at once while one is rotated), and what an accepted event becomes
# (its action). A JSON object in WEBHOOK_SOURCES_JSON replaces the default, which is the sandbox
# payment provider's outcome webhooks where the examples are installed (the sandbox is one of them),
# and no source otherwise. Its secret has no default, not even with DEBUG: without
# SANDBOX_WEBHOOK_SECRET it has no secret, and every delivery is refused (system check
# webhooks.W001 says so) rather than verified against a key anyone can read here (a default one let
# a customer of the demo forge the provider's "refund failed" for a refund in flight, then be paid
# twice). The sandbox provider signs its webhooks with the same variable: scripts/run.sh exports
# one value to both, made once for the machine.
SANDBOX_WEBHOOK_SECRET = envstr("SANDBOX_WEBHOOK_SECRET", "")
WEBHOOK_SOURCES: dict[str, Any] = envjson(
    "WEBHOOK_SOURCES_JSON",
    {
        "sandbox-payments": {
            "scheme": "standard",
            "secrets": [SANDBOX_WEBHOOK_SECRET] if SANDBOX_WEBHOOK_SECRET else [],
            "action": {"type": "operation_outcome", "system": "payments"},
        }
    }
    if INSTALL_EXAMPLES
    else {},
)
# `manage.py webhooks purge` deletes delivery records older than this by default (not those whose
# action is pending, nor failed ones unless --include-failed).
WEBHOOKS_RETENTION_DAYS = envint("WEBHOOKS_RETENTION_DAYS", 30)
# A source with "act": "later" answers 202 once the delivery is committed, and a worker runs its
# action (README "Acting now or later"). A try that fails is made again after 5 s, 15 s, 45 s, ...
# (up to an hour between tries), this many tries in all; then the delivery is failed, for an
# operator to act on again (admin, or `manage.py webhooks act-again`). The sweep sends a pending
# delivery's task again once it is this many seconds overdue (its message was lost).
WEBHOOKS_ACT_ATTEMPTS = envint("WEBHOOKS_ACT_ATTEMPTS", 8)
WEBHOOKS_ACT_GRACE_SECONDS = envint("WEBHOOKS_ACT_GRACE_SECONDS", 60)
# Deliveries rejected before their signature held (401, 413) are recorded up to this many per source
# and client address, and per source, in a window from the first (webhooks/rejections.py); past
# either, they are answered the same but only counted (metrics, one log line). 0: no limit.
WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS = envint("WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS", 100)
WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_SOURCE = envint("WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_SOURCE", 1000)
WEBHOOKS_REJECTIONS_WINDOW_SECONDS = envint("WEBHOOKS_REJECTIONS_WINDOW_SECONDS", 600)
WEBHOOKS_REJECTIONS_KEY_PREFIX = envstr("WEBHOOKS_REJECTIONS_KEY_PREFIX", "webhooks:rejected")

# --- The refund example (examples/refunds; read only where INSTALL_EXAMPLES is on) -------------
# The payment provider the "payments" ledger adapter talks to (examples/sandbox in development).
SANDBOX_PAYMENTS_URL = envstr("SANDBOX_PAYMENTS_URL", "http://127.0.0.1:8765")
# Refunds above this amount wait for a person in the "refund-approvers" group.
REFUND_APPROVAL_LIMIT = envstr("REFUND_APPROVAL_LIMIT", "100.00")
# How many refund requests one customer may have in progress (their runs not finished); more is a
# 429: a customer asking for a penny at a time must not fill the workers and the provider. 0: none.
REFUND_MAX_OPEN_REQUESTS = envint("REFUND_MAX_OPEN_REQUESTS", 10)
# How many supplier assessments one person may have open (not approved, rejected or failed), and
# how many source records (sources and their revisions) one assessment may hold; more is a 429:
# each keeps its evidence for good. 0: no limit.
SUPPLIER_MAX_OPEN_ASSESSMENTS = envint("SUPPLIER_MAX_OPEN_ASSESSMENTS", 10)
SUPPLIER_MAX_SOURCE_RECORDS = envint("SUPPLIER_MAX_SOURCE_RECORDS", 100)

# --- Operating it (ops: README "Operating it") -----------------------------------------------------
# `Authorization: Bearer <METRICS_TOKEN>` reads /metrics. Unset, /metrics answers 401 unless DEBUG is
# on (a development machine); `check --deploy` warns (ops.W001).
METRICS_TOKEN = envstr("METRICS_TOKEN", "")
# prometheus-client's multiprocess mode: every process (web, workers and their prefork children,
# beat) writes its counters and histograms to files in this folder, and /metrics adds them up. Set
# it, to the same empty folder, for every process before it starts, and empty it when the whole
# system restarts (scripts/run.sh does both). Unset: /metrics shows the answering process's own.
PROMETHEUS_MULTIPROC_DIR = envstr("PROMETHEUS_MULTIPROC_DIR", "")
# Seconds /readyz waits for Redis and for the broker, each.
READYZ_TIMEOUT = envfloat("READYZ_TIMEOUT", 2.0)

# LOG_FORMAT=json: one JSON object per line (ops/logformat.py), with the context of each state
# change (event, run_id, attempt, step, turn_id, operation_key) as keys of its own; plain: text.
LOG_FORMAT = envstr("LOG_FORMAT", "plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: use plain or json")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "ops.logformat.JsonFormatter"},
    },
    # Request lines name the route, not the path a client typed (ops.logformat.RequestPathFilter).
    "filters": {"request_paths": {"()": "ops.logformat.RequestPathFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["request_paths"]}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
}
