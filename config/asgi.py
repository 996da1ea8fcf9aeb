import gc
import os
from typing import Any

import django
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousFileOperation
from django.http import FileResponse, Http404, HttpRequest, HttpResponse

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# No persistent database connections of their own in an ASGI server (Django's documentation says to
# disable them there): the ORM runs in a pool of threads, each kept a connection of its own, and a
# burst of requests left one idle connection per thread behind, until PostgreSQL refused everyone
# else ("too many clients"). On PostgreSQL the server borrows connections from a bounded pool
# instead (DATABASE_POOL, config/settings.py): no connection is opened per visit, and a burst waits
# for the pool. Workers keep theirs (DATABASE_CONN_MAX_AGE). Forced, not a default: one environment
# usually serves both kinds of process.
os.environ["DATABASE_CONN_MAX_AGE"] = "0"
os.environ["DATABASE_POOL"] = "1"
django.setup(set_prefix=False)  # before the consumers are imported (as get_asgi_application does)

from config.handlers import ASGIHandler  # noqa: E402
from config.server import drop_twisted_access_log, leave_form_bodies_to_django, limit_request_bodies  # noqa: E402

leave_form_bodies_to_django()
drop_twisted_access_log()
limit_request_bodies(settings.HTTP_MAX_BODY_BYTES)

django_asgi_app: Any = ASGIHandler()  # Django's, with the middleware chain in one thread (see there)


class StaticFilesHandler(ASGIStaticFilesHandler):
    """Django's handler, with a path that leads out of the static folders (``/static/../x``, or
    ``%2e%2e`` that the server decodes) a 404: there is no such static file. Django's own handler
    lets the finders' SuspiciousFileOperation escape, which is a 500 and a traceback for anyone."""

    def serve(self, request: HttpRequest) -> HttpResponse | FileResponse:
        try:
            return super().serve(request)
        except SuspiciousFileOperation:
            raise Http404("no such static file") from None


if settings.SERVE_STATIC:
    # The admin's and the docs page's assets, straight from the apps (no collectstatic needed).
    django_asgi_app = StaticFilesHandler(django_asgi_app)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from config.origin import SameOriginValidator  # noqa: E402
from config.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# Everything loaded by now (Django, the apps, the URLconf, the consumers) lives as long as the
# process. Taken out of the collector's generations, it is no longer walked by every full
# collection: those paused a daphne here for tens of milliseconds at a time (two daphnes' GET
# /healthz went from about 1,850 a second with a p99 of 80 to 130 ms, to about 2,150 with a p99 of
# 30 to 50 ms, bench/inbound.py's floor in one hour).
gc.freeze()
