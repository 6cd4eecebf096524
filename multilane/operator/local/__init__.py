"""The local room: the same controller driving worker subprocesses on 127.0.0.1. Does I/O.

``plane`` (the local control plane, used by the demo), ``platform`` (``LocalPlatform``).
"""
