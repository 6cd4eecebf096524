"""The worker engine: one Kafka consumer per process feeding records into lanes.

Pure decision modules (``keyranges``, ``offsets``, ``progress``) do no I/O; the runtime modules
(``engine``, ``control``, ``metrics``, ``progress_store``, ``state``) talk to Kafka, RocksDB and HTTP.
"""
