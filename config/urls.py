from django.apps import apps
from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from agents.views import chat, chat_start
from workflows.apis import converters  # noqa: F401  registers <name:...>
from workflows.apis.notfound import ApiNotFound

# The examples' APIs, each routed only where its app is installed (settings.INSTALL_EXAMPLES):
# without them their paths are the API's JSON 404, as any path no operation matches.
EXAMPLE_APIS = {"examples.refunds": "examples.refunds.urls", "examples.suppliers": "examples.suppliers.urls"}
example_apis: list[URLPattern | URLResolver] = [
    path("api/", include(urls)) for app, urls in EXAMPLE_APIS.items() if apps.is_installed(app)
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include("workflows.apis.urls")),
    path("api/", include("ledger.urls")),
    path("api/", include("approvals.urls")),
    path("api/agents/", include("agents.urls")),
    path("api/submissions/", include("agents.submission_urls")),
    *example_apis,
    re_path(r"^api/", ApiNotFound.as_view(), name="api-not-found"),  # after every api/ route: JSON 404
    path("webhooks/", include("webhooks.urls")),  # signed inbound events: no session, no CSRF
    path("", include("ops.urls")),  # /healthz, /readyz, /metrics (Bearer METRICS_TOKEN)
    path("", include("workflows.urls")),
    path("chat/", chat_start, name="agent-chat-start"),
    path("chat/<name:kind>/<name:name>/", chat, name="agent-chat"),
    path("", include("portal.urls")),  # /accounts/login/, /accounts/logout/ and the home page /
]
