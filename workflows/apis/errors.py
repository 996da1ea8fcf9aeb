"""JSON errors for every API: {"error": {"code", "message", "detail"}}."""
