"""Per-partition state stores on RocksDB, their changelog, restore and learner mode. Does I/O."""
