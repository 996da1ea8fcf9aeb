from django.urls import path

from webhooks.views import receive

urlpatterns = [path("<str:source>/", receive, name="webhook-receive")]
