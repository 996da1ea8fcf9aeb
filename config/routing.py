from django.urls import re_path

from workflows.consumers import NotFoundConsumer, RunConsumer

# A run id in the form the HTTP API takes: hyphenated hex, in either case (RFC 4122 reads UUIDs
# case-insensitively; Django's <uuid:> takes lower case only). Other spellings UUID() would
# accept (no hyphens, braces, a urn: prefix) are not a run's path.
RUN_ID = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

websocket_urlpatterns = [
    re_path(rf"^ws/runs/(?P<run_id>{RUN_ID})/$", RunConsumer.as_asgi()),
    # Last, matching any path: without it the router raises ValueError for an unknown path, which
    # daphne answers with a 500 and a traceback in the log.
    re_path(r"", NotFoundConsumer.as_asgi()),
]
