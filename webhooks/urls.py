from django.urls import path, re_path

from webhooks.views import not_found, receive

urlpatterns = [
    path("<str:source>/", receive, name="webhook-receive"),
    # Without the slash too: Django would answer a POST there with a redirect (APPEND_SLASH), which
    # senders follow with a GET or not at all (and with DEBUG on, a 500 saying so).
    path("<str:source>", receive),
    # Any other path under /webhooks/ (a sender's URL with a segment too many): the same JSON 404 as
    # a source nobody configured, not Django's page.
    re_path(r"^", not_found),
]
