"""The refund world (a sandbox provider and real workers with beat) for the tests that follow a real
refund from the home page; the fixtures are the refund tests' own."""

from examples.refunds.tests.conftest import refund_workers, sandbox, world  # noqa: F401
