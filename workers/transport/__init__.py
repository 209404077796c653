"""The only code that knows Celery and kombu: the app, bounded decoding of what the broker delivers
(``inbound``), consuming (fair lanes), confirmed publishing, the topology, and the receipt sink.
The router and the pools hand it typed values and bytes."""
