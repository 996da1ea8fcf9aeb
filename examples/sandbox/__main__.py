"""``python -m examples.sandbox [--host 127.0.0.1] [--port 8765] [--data FILE]``: the sandbox
payment provider as a standalone HTTP service (standard library only, no Django)."""

from __future__ import annotations

import argparse
import signal
import sys
from decimal import Decimal, InvalidOperation
from types import FrameType

from examples.sandbox.server import Config, SandboxServer
from examples.sandbox.store import Store

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
    return parser.parse_args(argv)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)  # raised in the main thread, out of serve_forever


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    store = Store(args.data)
    server = SandboxServer(
        (args.host, args.port), store, Config(timeout_seconds=args.timeout_seconds, decline_above=args.decline_above)
    )
    signal.signal(signal.SIGTERM, _stop)
    host, port = args.host, server.server_port
    print(f"sandbox provider listening on http://{host}:{port} (data {store.path})", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
        print("sandbox provider stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
