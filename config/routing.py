from django.urls import re_path

from agents.consumers import AgentConsumer
from workflows.apis.converters import NAME_CHARACTER, NAME_MAX
from workflows.consumers import NotFoundConsumer, RunConsumer

# A run id in the form the HTTP API takes: hyphenated hex, in either case (RFC 4122 reads UUIDs
# case-insensitively; Django's <uuid:> takes lower case only). Other spellings UUID() would
# accept (no hyphens, braces, a urn: prefix) are not a run's path.
RUN_ID = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
# An agent's kind and name as the HTTP API takes them: no slash, no control character; their
# lengths are the selectors' to check (a longer one names no agent: 4404).
AGENT_PART = f"{NAME_CHARACTER}{{1,{NAME_MAX}}}"

websocket_urlpatterns = [
    re_path(rf"^ws/runs/(?P<run_id>{RUN_ID})/$", RunConsumer.as_asgi()),
    re_path(rf"^ws/agents/(?P<kind>{AGENT_PART})/(?P<name>{AGENT_PART})/$", AgentConsumer.as_asgi()),
    # Last, matching any path: without it the router raises ValueError for an unknown path, which
    # daphne answers with a 500 and a traceback in the log.
    re_path(r"", NotFoundConsumer.as_asgi()),
]
