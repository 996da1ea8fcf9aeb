"""``python -m examples.sandbox [--host 127.0.0.1] [--port 8765] [--data FILE] [--webhook-url URL]``:
the sandbox payment provider as a standalone HTTP service (standard library only, no Django).

The webhook secret is ``--webhook-secret`` or, so that it stays off the command line (where any
local user can read it), the environment's ``SANDBOX_WEBHOOK_SECRET``: the variable the project's
settings read for the receiving source, so one exported value serves both (``scripts/run.sh``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from decimal import Decimal, InvalidOperation
from types import FrameType

from examples.sandbox.faults import FaultError, parse_webhook_faults
from examples.sandbox.server import Config, SandboxServer, log_lock
from examples.sandbox.store import Store
from examples.sandbox.webhooks import Dispatcher, WebhookConfig, WebhookConfigError, check_url, secret_key

DEFAULT_DATA = "var/sandbox-provider.sqlite3"


def _decimal(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a decimal: {text!r}") from None
    if not value.is_finite() or value <= 0:
        raise argparse.ArgumentTypeError("must be a positive amount")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 600:
        raise argparse.ArgumentTypeError("must be between 0 and 600 seconds")
    return value


def _attempts(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError("must be a whole number from 1 to 100")
    return int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.sandbox",
        description="Sandbox payment provider: idempotent refunds, lookups by key, injected faults.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    parser.add_argument("--data", default=DEFAULT_DATA, help=f"SQLite file holding the state (default {DEFAULT_DATA})")
    parser.add_argument(
        "--timeout-seconds",
        type=_seconds,
        default=30.0,
        help="how long the 'timeout' fault holds the answer back unless told (default 30)",
    )
    parser.add_argument(
        "--decline-above",
        type=_decimal,
        default=Decimal("10000"),
        help="refunds of a larger amount are declined with 402 (default 10000)",
    )
    parser.add_argument(
        "--settle-after",
        type=_seconds,
        default=None,
        metavar="S",
        help="answer refunds 'pending' and settle them S seconds later (succeeded; failed when above "
        "--decline-above, instead of a 402), each with its webhook (default: settled at once)",
    )
    hooks = parser.add_argument_group("outcome webhooks (Standard Webhooks)")
    hooks.add_argument("--webhook-url", default=None, help="POST each refund's outcome event here (default: none)")
    hooks.add_argument(
        "--webhook-secret",
        default=os.environ.get("SANDBOX_WEBHOOK_SECRET") or None,
        help="signing secret, whsec_<base64> (default: $SANDBOX_WEBHOOK_SECRET)",
    )
    hooks.add_argument(
        "--webhook-faults",
        default="",
        help="webhook faults every event suffers, comma-separated: drop, duplicate, delay=S, reorder[=N]",
    )
    hooks.add_argument(
        "--webhook-max-attempts", type=_attempts, default=8, help="attempts before an event is given up (default 8)"
    )
    hooks.add_argument(
        "--webhook-backoff",
        type=_seconds,
        default=0.5,
        help="seconds before the first retry, doubled after each (at most 30; default 0.5)",
    )
    hooks.add_argument(
        "--webhook-hold-seconds",
        type=_seconds,
        default=10.0,
        help="the longest a reordered event waits for its burst (default 10)",
    )
    args = parser.parse_args(argv)
    try:
        args.webhook_faults = tuple(str(f) for f in parse_webhook_faults(args.webhook_faults))
    except FaultError as exc:
        parser.error(f"--webhook-faults: {exc}")
    if args.webhook_url is not None:
        if not args.webhook_secret:
            parser.error("--webhook-url needs a secret: --webhook-secret or SANDBOX_WEBHOOK_SECRET")
        try:
            check_url(args.webhook_url)
            secret_key(args.webhook_secret)
        except WebhookConfigError as exc:
            parser.error(str(exc))
    return args


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)  # raised in the main thread, out of serve_forever


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    store = Store(args.data)
    webhooks = WebhookConfig(
        url=args.webhook_url,
        secret=args.webhook_secret or "",
        faults=args.webhook_faults,
        max_attempts=args.webhook_max_attempts,
        backoff=args.webhook_backoff,
        hold_seconds=args.webhook_hold_seconds,
    )
    config = Config(
        timeout_seconds=args.timeout_seconds,
        decline_above=args.decline_above,
        settle_after=args.settle_after,
        webhook_faults=webhooks.faults if webhooks.enabled else None,
    )
    server = SandboxServer((args.host, args.port), store, config)
    dispatcher = Dispatcher(store, webhooks, log_lock)
    signal.signal(signal.SIGTERM, _stop)
    host, port = args.host, server.server_port
    if webhooks.enabled:
        faults = ",".join(webhooks.faults) or "none"
        print(f"sandbox provider posts outcome webhooks to {webhooks.url} (faults {faults})", flush=True)
    print(f"sandbox provider listening on http://{host}:{port} (data {store.path})", flush=True)
    if webhooks.enabled or config.settle_after is not None:  # otherwise it has nothing to do
        dispatcher.start()
    try:
        server.serve_forever(poll_interval=0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        dispatcher.stop()
        server.server_close()
        if dispatcher.is_alive():
            dispatcher.join(timeout=5)
        print("sandbox provider stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
