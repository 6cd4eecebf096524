"""The rollout room: moving partitions between workers, restore-before-handoff.

``protocol`` (the pure rollout state machine), ``handoff_model`` (pure parts of a handoff step),
``handoff`` (``HandoffExecutor``: a step against the workers) over ``handoff_round`` (one round of
actions), ``handoff_calls`` (the batched worker calls) and ``handoff_memory`` (what the executor
remembers), ``handoff_control`` (the worker calls), ``assignment`` (the fenced assignment protocol),
``workers`` (``WorkerControlClient``, HTTP). ``protocol``, ``handoff_model`` and ``handoff_memory``
are pure; the rest does I/O through the worker control API.
"""
