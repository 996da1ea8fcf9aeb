"""How many unverified rejections are recorded: a bound on what anyone can make us store.

Anyone may post to a configured source, and a delivery whose signature does not hold (401) or that
is too large to check (413) is still recorded, so that "did we receive it?" has an answer. Unbounded,
that is a table anyone can fill: one row, its headers and a log line a request, at whatever rate
they send. So these rejections are counted in Redis, per source and client address
(WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS, 100) and per source
(WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_SOURCE, 1,000), each for WEBHOOKS_REJECTIONS_WINDOW_SECONDS
(600) from its first. Past a count's limit a rejection is answered exactly as before, but not
recorded: it is counted in ``webhooks_rejections_unrecorded_total`` (and in
``webhooks_deliveries_total`` as rejected), and the first one past a limit in a window says so in
the log, once. A limit of 0 records every one.

Only rejections before the signature held are counted. A delivery whose signature held and that is
still refused (a body that is not JSON, an event the action refuses, an outage) comes from someone
with the secret, and is always recorded. If Redis cannot be reached, every rejection is recorded.
"""

from __future__ import annotations

import logging

import redis
from django.conf import settings

from accounts.addresses import limit_script, redis_down
from webhooks.metrics import DELIVERIES, REJECTIONS_UNRECORDED

logger = logging.getLogger("webhooks")

# KEYS: the counts, the address's first; ARGV[1]: the window in seconds, ARGV[1 + i]: the limit of
# KEYS[i]. Counted in order (a new count living for the window) up to the first past its limit, so
# that an address past its own limit no longer counts against the source's (where it would keep the
# rejections of every other sender from being recorded). Returns {i, n, full}: the count past its
# limit (its place, its new value) or 0, 0, and whether the last count (the source's) is at its
# limit already. Redis runs a script alone: no two read the same count.
COUNT = """
local last = KEYS[#KEYS]
local full = tonumber(redis.call('GET', last) or '0') >= tonumber(ARGV[#KEYS + 1]) and 1 or 0
for i, key in ipairs(KEYS) do
  redis.call('SET', key, 0, 'EX', ARGV[1], 'NX')
  local n = redis.call('INCR', key)
  if n > tonumber(ARGV[i + 1]) then
    return {i, n, full}
  end
end
return {0, 0, full}
"""


def record_allowed(*, source: str, address: str) -> bool:
    """Count one unverified rejection of ``source`` from ``address``: whether it is to be recorded.
    Not recorded, it is counted in the metrics here."""
    prefix, window = settings.WEBHOOKS_REJECTIONS_KEY_PREFIX, max(1, int(settings.WEBHOOKS_REJECTIONS_WINDOW_SECONDS))
    counts = [
        (f"{prefix}:address:{source}:{address}", int(settings.WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_ADDRESS), address),
        (f"{prefix}:source:{source}", int(settings.WEBHOOKS_MAX_REJECTIONS_RECORDED_PER_SOURCE), "all addresses"),
    ]
    counts = [count for count in counts if count[1] > 0]
    if not counts:
        return True
    try:
        over, value, full = limit_script(COUNT)(
            keys=[key for key, _, _ in counts], args=[window, *(limit for _, limit, _ in counts)]
        )
    except redis.RedisError as exc:
        redis_down(logger, "webhook rejections are not counted, and all are recorded", exc)
        return True
    if not over:
        return True
    DELIVERIES.labels(source, "rejected").inc()
    REJECTIONS_UNRECORDED.labels(source).inc()
    _, limit, whom = counts[int(over) - 1]
    # Said once a window for each count past its limit, but for no address once the source's is:
    # the lines would grow with the addresses a forger has (every IPv6 /64 is one).
    if int(value) == limit + 1 and not (full and int(over) < len(counts)):
        logger.warning(
            "webhook %s: more than %d rejections from %s in %d s; the rest of the window's are answered, not recorded",
            source,
            limit,
            whom,
            window,
            extra={"event": "delivery.rejections_unrecorded", "source": source, "limit": limit},
        )
    return False
