"""The control plane: kopf handlers that own ParallelConsumer children, assignment and scaling.

Pure modules (``policy``, ``planner``, ``rollout``) do no I/O and are reused by the simulator; the
handler modules talk to the Kubernetes API, Prometheus, Kafka and the workers' control endpoints.
"""
