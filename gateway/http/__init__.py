"""HTTP and WebSocket, the transport: h11 and wsproto, the router, the API document."""
