from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include("workflows.apis.urls")),
    path("api/", include("ledger.urls")),
    path("api/", include("approvals.urls")),
    path("api/", include("examples.refunds.urls")),
    path("api/", include("examples.suppliers.urls")),
    path("", include("workflows.urls")),
    path("", include("portal.urls")),  # /accounts/login/, /accounts/logout/ and the home page /
]
