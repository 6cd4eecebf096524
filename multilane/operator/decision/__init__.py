"""The decision room: what the consumer should look like. Pure: no I/O.

``policy`` (``AutoscalePolicy.decide``), ``policy_model`` (config, observation, decision, rules),
``capacity`` (the capacity model), ``policy_state`` (what it remembers), ``damping`` (settle,
follow, bottleneck, periodic, scale-down rules),
``explain`` (the words of a decision), ``planner`` (``AssignmentPlanner``: partitions onto workers).
The simulator reuses this room unchanged.
"""
