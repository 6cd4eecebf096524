"""The local demo and the example processors. ``run`` does I/O (``multilane demo``: the embedded
broker, the local control plane with worker processes, the load generator); ``report`` (timeline,
figures, live view; the plot writes a PNG) and ``check`` (delivery checkers and the state reference)
are pure; ``processors`` and ``examples`` are processors for ``multilane worker --processor``
(``multilane.demo.processors:stateful_io``, ``multilane.demo.examples:noop``, ...)."""
