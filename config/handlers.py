"""The project's ASGI handler for HTTP: Django's, with a request served in one thread hop."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler as DjangoASGIHandler
from django.core.handlers.asgi import ASGIRequest, get_script_prefix
from django.db import close_old_connections
from django.http import FileResponse
from django.http.response import HttpResponseBase
from django.urls import set_script_prefix


@functools.cache
def _threads() -> ThreadPoolExecutor:
    """The process's request threads, started as they are first needed."""
    return ThreadPoolExecutor(max_workers=settings.ASGI_REQUEST_THREADS, thread_name_prefix="request")


class ASGIHandler(DjangoASGIHandler):
    """Django's ASGI handler, with everything a request does in Django run synchronously, in one
    thread hop from the event loop: the ``request_started`` receivers, the middleware chain, the
    view middleware and a sync view, and, for a response whose content is in memory, its closing
    (``request_finished``, which gives the database connection back) before it is sent.

    Django builds its ASGI chain in async mode, and calls a middleware written for both (all of
    Django's own, through MiddlewareMixin) in its async form: each ``process_request``,
    ``process_view`` and ``process_response`` is then handed to a thread and back, with the view
    a hop of its own, and the signals before and after are hops too. That was sixteen thread
    switches a request; on a two-core machine most of the CPU a trivial request costs through
    daphne. An async view (the SSE streams) is run by ``async_to_sync`` from that thread on the
    server's loop, and a streaming response is sent by the loop after the chain has returned, as
    Django sends it (stopped when the client goes away), then closed in a second hop.

    The hop goes to a pool of ASGI_REQUEST_THREADS threads kept for the process, as a threaded WSGI
    server runs Django, not to a thread started for the request: under ``ThreadSensitiveContext``
    Django's handler starts a new thread for every request and stops it after, which was half of what
    a trivial request cost here. Everything a request does in Django is in that one call, so it needs
    no thread of its own (an async view's database visits come back to it through
    ``async_to_sync``, as they would to Django's).
    """

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)  # the sync chain, which BaseHandler.get_response calls

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        try:
            response = await sync_to_async(self.respond, thread_sensitive=False, executor=_threads())(scope, body_file)
            if response.streaming:
                await self.stream(response, receive, send)
            else:
                await self.send_response(response, send)
        finally:
            body_file.close()

    def create_request(
        self, scope: Mapping[str, Any], body_file: IO[bytes]
    ) -> tuple[ASGIRequest, None] | tuple[None, HttpResponseBase]:
        """Django's request, with the length of a body sent chunked: the server has read it whole
        by now (within HTTP_MAX_BODY_BYTES), but without a ``Content-Length`` DRF reads no body at
        all, and the API would act on ``{}``: a run started with an empty payload and its
        idempotency key spent on it."""
        created = super().create_request(scope, body_file)
        request = created[0]
        if request is not None and "CONTENT_LENGTH" not in request.META:
            size = body_file.seek(0, os.SEEK_END)
            body_file.seek(0)
            if size:
                request.META["CONTENT_LENGTH"] = str(size)
        return created

    def respond(self, scope: dict[str, Any], body_file: Any) -> HttpResponseBase:
        """The response to the request (in the request's thread); closed if it is not streamed."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        response = self.get_response(request) if request is not None else error_response
        assert response is not None  # create_request gives a request or the response refusing it
        setattr(response, "_handler_class", self.__class__)  # noqa: B010  # as Django's handler sets it
        if isinstance(response, FileResponse):
            response.block_size = self.chunk_size  # the server chunks the body itself
        if not response.streaming:
            response.close()  # its content stays: only the request's resources and connection go
        else:
            # Streamed by the loop, and closed from another thread when it ends: what the chain
            # used of the database in this thread goes back to the pool now, not at this thread's
            # next request.
            close_old_connections()
        return response

    async def stream(self, response: HttpResponseBase, receive: Any, send: Any) -> None:
        """Send a streaming response until it ends or the client goes away (as Django does), then
        close it."""

        async def sending() -> None:
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client went away meanwhile

        tasks = [asyncio.create_task(self.listen_for_disconnect(receive)), asyncio.create_task(sending())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if not task.done():
                    task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, RequestAborted):
                    pass
        finally:  # closed whatever happened to the stream (its generator may have raised)
            await sync_to_async(response.close, thread_sensitive=True)()
