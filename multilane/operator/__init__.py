"""The control plane: the ParallelConsumer controller, arranged as rooms that only look down.

- ``k8s`` and ``local``: the two ways to run the controller (kopf on Kubernetes; subprocesses).
- ``controller`` (``ConsumerController``), ``metrics``, ``sources`` (lag and rates), ``kafka_admin``,
  ``platform`` (the ``Platform`` protocol): shared by both.
- ``rollout``: restore-before-handoff and the fenced assignment protocol.
- ``decision`` and ``spec``: pure (policy, planner; spec validation, children, conditions), reused
  by the simulator.
"""
