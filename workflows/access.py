"""A user's access changed: their open sockets check it again at once.

Every socket (``workflows.consumers.StreamConsumer``) joins its user's group as soon as connect
knows the user is signed in, before it checks what they may see. ``access_changed`` pushes to that
group once the change is committed, and each socket checks again what connect checked (once
connect has ended), closing if it no longer holds (4401 signed out, 4404 no longer visible).
Without it a socket found out on its next client message or within WEBSOCKET_RECHECK_SECONDS of
pushes; that re-check stays, for what sends no signal (a session deleted in the database, a
membership removed by raw SQL) and for a push that was lost.

Sent for: a sign-out (the message names the session, by an HMAC of its key: Django deletes the
session only after the signal, and that session's sockets close without asking the database), any
save of the user but a sign-in's ``last_login`` (deactivated, password changed), the user deleted,
and, from the agents app, a membership removed or moved to another user or account. Best effort,
as every push: it goes through the process's publisher, which a short-lived process (a shell, a
command) waits for at exit (``streams.EXIT_FLUSH_SECONDS``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.utils.crypto import salted_hmac

from workflows.streams import group_send_later

MESSAGE_TYPE = "access.changed"  # StreamConsumer.access_changed


def group_name(user_id: Any) -> str:
    return f"user.{user_id}"


def session_mark(session_key: str) -> str:
    """What a push says of a session: an HMAC of its key, never the key (a bearer credential)."""
    return salted_hmac("workflows.access.session", session_key, algorithm="sha256").hexdigest()


def access_changed(user_id: Any, *, session: str | None = None) -> None:
    """Have ``user_id``'s open sockets check their access again, once the transaction commits;
    ``session``: the key of the session signed out (its sockets close without checking)."""
    message = {"type": MESSAGE_TYPE, "session": session_mark(session) if session else None}
    transaction.on_commit(lambda: group_send_later(group_name(user_id), message))


def _signed_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:
        access_changed(user.pk, session=getattr(getattr(request, "session", None), "session_key", None))


def membership_changed(*, sender: Any, instance: Any, signal: Any, **kwargs: Any) -> None:
    """A membership of an account (``accounts.Membership``, connected by the agents app for
    pre_save, post_save and post_delete) removed, or saved for another user or account: the user
    it was for loses what it gave them. Pushed after the write (a push sent before it, outside a
    transaction, could have sockets check before the change is there)."""
    if signal is pre_save:
        if instance.pk is not None:  # a new one takes nothing away
            before = type(instance).objects.filter(pk=instance.pk).values_list("user_id", "account_id").first()
            if before is not None and before != (instance.user_id, instance.account_id):
                instance._access_moved_from = before[0]
        return
    if signal is post_save:
        moved_from = instance.__dict__.pop("_access_moved_from", None)
        if moved_from is not None:
            access_changed(moved_from)
        return
    access_changed(instance.user_id)


def _user_saved(sender: Any, instance: Any, created: bool, update_fields: Any, **kwargs: Any) -> None:
    if not created and (update_fields is None or set(update_fields) != {"last_login"}):
        access_changed(instance.pk)


def _user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    access_changed(instance.pk)


def connect_signals() -> None:
    """From the app's ``ready()``."""
    user_model = get_user_model()
    user_logged_out.connect(_signed_out, dispatch_uid="workflows.access.signed_out")
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="workflows.access.user_saved")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid="workflows.access.user_deleted")
