"""The decision room: what the consumer should look like. Pure: no I/O.

``policy`` (``AutoscalePolicy.decide``), ``policy_model`` (config, observation, decision, rules),
``capacity`` (the capacity model), ``damping`` (settle, follow, bottleneck, scale-down rules),
``explain`` (the words of a decision), ``planner`` (``AssignmentPlanner``: partitions onto workers).
The simulator reuses this room unchanged.
"""
