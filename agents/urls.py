"""/api/agents/<kind>/<name>...: paths without a trailing slash (docs/decisions/0010-api-paths-and-error-format.md).

A kind or name that does not match ``<name:...>`` matches no route: the API's catch-all JSON 404.
"""

from django.urls import URLPattern, path

from agents.apis import AgentMessageApi, AgentSnapshotApi, AgentTurnApi, AgentTurnStopApi
from agents.sse import turn_stream
from agents.submission_apis import agent_submissions
from workflows.apis import converters  # noqa: F401  registers <name:...>

# turn_id is matched as text and parsed by the view: a malformed id is the API's JSON 404.
urlpatterns: list[URLPattern] = [
    path("<name:kind>/<name:name>", AgentSnapshotApi.as_view(), name="api-agent-snapshot"),
    path("<name:kind>/<name:name>/messages", AgentMessageApi.as_view(), name="api-agent-message-send"),
    path("<name:kind>/<name:name>/submissions", agent_submissions, name="api-agent-submissions"),
    path("<name:kind>/<name:name>/turns/<str:turn_id>", AgentTurnApi.as_view(), name="api-agent-turn"),
    path("<name:kind>/<name:name>/turns/<str:turn_id>/stop", AgentTurnStopApi.as_view(), name="api-agent-turn-stop"),
    path("<name:kind>/<name:name>/turns/<str:turn_id>/stream", turn_stream, name="api-agent-turn-stream"),
]
