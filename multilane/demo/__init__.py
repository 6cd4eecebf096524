"""The local demo and the example processors. ``run`` does I/O (``multilane demo``: the embedded
broker, the local control plane with worker processes, the load generator); ``report`` is pure but for
the plot (a PNG) and the live view (the terminal); ``check`` applies the delivery checkers (pure) and
reads the state reference from the changelog (I/O); ``processors`` and ``examples`` are processors for
``multilane worker --processor`` (``multilane.demo.processors:stateful_io``,
``multilane.demo.examples:noop``, ...)."""
