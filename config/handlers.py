"""The project's ASGI handler for HTTP: Django's, with the middleware chain run in one thread."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler as DjangoASGIHandler


class ASGIHandler(DjangoASGIHandler):
    """Django's ASGI handler, with the middleware chain, the view middleware and a sync view run
    synchronously, in one thread per request.

    Django builds its ASGI chain in async mode, and calls a middleware written for both (all of
    Django's own, through MiddlewareMixin) in its async form: each ``process_request``,
    ``process_view`` and ``process_response`` is then handed to a thread and back, with the view
    a hop of its own. That is about fifteen thread switches a request; on a two-core machine a
    third of the CPU a trivial request costs through daphne. Built in sync mode and entered once
    from the event loop, the chain is one hop. An async view (the SSE streams) is run by
    ``async_to_sync`` from that thread on the server's loop, and a streaming response is still
    sent by the loop, after the chain has returned.

    The request's own thread stays Django's (``ThreadSensitiveContext``, one per request), so
    requests do not queue behind one another's database waits.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        chain = self._middleware_chain  # type: ignore[has-type]  # set by load_middleware, unannotated
        self._middleware_chain = sync_to_async(chain, thread_sensitive=True)
