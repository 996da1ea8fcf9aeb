from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from workflows.apis.notfound import ApiNotFound

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include("workflows.apis.urls")),
    path("api/", include("ledger.urls")),
    path("api/", include("approvals.urls")),
    path("api/", include("examples.refunds.urls")),
    path("api/", include("examples.suppliers.urls")),
    re_path(r"^api/", ApiNotFound.as_view(), name="api-not-found"),  # after every api/ route: JSON 404
    path("", include("workflows.urls")),
    path("", include("portal.urls")),  # /accounts/login/, /accounts/logout/ and the home page /
]
