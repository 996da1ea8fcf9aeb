"""``FSMModelMixin``: django-fsm's mixin, with a ``refresh_from_db`` that is safe in threads.

A protected ``FSMField`` refuses assignment once it has a value, and Django's ``refresh_from_db``
assigns every field it reloads. django-fsm's own mixin gets around that by switching the field's
``protected`` flag off for the refresh and on again after it: on the field, which every instance in
every thread shares. Under an ASGI server's thread pool, one request's refresh switched it back on in
the middle of another's, which then failed with "Direct status modification is not allowed" (500s
under concurrent submissions, found by bench/inbound.py). Here the refresh drops this instance's own
values of the protected fields first (the field then takes a value, as when a row is loaded), and
touches nothing shared.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import django_fsm
from django.db import models
from django_fsm import FSMFieldMixin


class FSMModelMixin(django_fsm.FSMModelMixin):
    def refresh_from_db(
        self, using: str | None = None, fields: Iterable[str] | None = None, from_queryset: Any = None
    ) -> None:
        protected = {
            field.attname
            for field in self._meta.concrete_fields
            if isinstance(field, FSMFieldMixin) and field.protected
        }
        if fields is None:
            # What Django reloads without a list, named: a dropped value would look deferred.
            vars(self)["_prefetched_objects_cache"] = {}
            deferred = self.get_deferred_fields()
            fields = [f.attname for f in self._meta.concrete_fields if f.attname not in deferred]
        fields = list(fields)
        held = {name: self.__dict__.pop(name) for name in protected & set(fields) if name in self.__dict__}
        try:
            models.Model.refresh_from_db(self, using=using, fields=fields, from_queryset=from_queryset)
        except BaseException:
            for name, value in held.items():
                self.__dict__.setdefault(name, value)
            raise
