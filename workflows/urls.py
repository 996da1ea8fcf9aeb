from django.urls import URLPattern, path

from workflows import views

urlpatterns: list[URLPattern] = [
    path("runs/<uuid:run_id>/", views.run_detail, name="run-detail"),
]
