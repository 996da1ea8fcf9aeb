"""Operating the system: liveness (``/healthz``), readiness (``/readyz``), Prometheus metrics
(``/metrics``) and the JSON log format. It reads every app and nothing imports it but ``config``."""
