from django.urls import path

from webhooks.views import receive

urlpatterns = [
    path("<str:source>/", receive, name="webhook-receive"),
    # Without the slash too: Django would answer a POST there with a redirect (APPEND_SLASH), which
    # senders follow with a GET or not at all (and with DEBUG on, a 500 saying so).
    path("<str:source>", receive),
]
