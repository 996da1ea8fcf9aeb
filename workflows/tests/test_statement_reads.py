"""A raw statement's row read as a queryset would read it (``workflows.statements.instance_from_row``),
with each connection's converters found once and kept no longer than the connection."""

from __future__ import annotations

import gc
import uuid
import weakref

from django.db.utils import ConnectionHandler

from workflows.models import WorkflowRun
from workflows.statements import instance_from_row, value_from_db


def test_a_connections_converters_are_kept_with_it_and_go_with_it() -> None:
    # given an SQLite connection (its converters are methods of the connection's own operations)
    handler = ConnectionHandler({"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}})
    db = handler["default"]
    field = WorkflowRun._meta.get_field("id")
    run_id = uuid.uuid4()

    # when rows are read through it, twice
    assert value_from_db(db, field, run_id.hex) == run_id
    assert value_from_db(db, field, run_id.hex) == run_id  # the second time from what the first found
    fields = WorkflowRun._meta.concrete_fields
    run = WorkflowRun(id=run_id, workflow="w", payload={"a": 1})
    row = [f.get_db_prep_save(getattr(run, f.attname), connection=db) for f in fields]  # as SQLite keeps them
    read = instance_from_row(db, WorkflowRun, row)
    assert (read.id, read.payload) == (run_id, {"a": 1})

    # then once the connection is closed and dropped, nothing keeps it alive
    gone = weakref.ref(db)
    db.close()
    del db, handler
    gc.collect()
    assert gone() is None
