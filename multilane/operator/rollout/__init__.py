"""The rollout room: moving partitions between workers, restore-before-handoff.

``protocol`` (the pure rollout state machine), ``handoff_model`` (pure parts of a handoff step),
``handoff`` (``HandoffExecutor``: a step against the workers), ``handoff_control`` (the worker calls),
``assignment`` (the fenced assignment protocol), ``workers`` (``WorkerControlClient``, HTTP).
``protocol`` and ``handoff_model`` are pure; the rest does I/O through the worker control API.
"""
