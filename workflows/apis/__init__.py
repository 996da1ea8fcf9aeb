"""DRF APIs of the workflows app: one module per entity (runs), shared pieces in common, errors."""
