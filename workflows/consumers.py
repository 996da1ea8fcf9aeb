"""WebSocket consumers (filled in below)."""
from channels.generic.websocket import AsyncJsonWebsocketConsumer


class RunConsumer(AsyncJsonWebsocketConsumer):
    pass
