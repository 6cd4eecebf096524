"""The Kubernetes room: kopf handlers, the API client and the pods-and-Leases platform. Does I/O.

``handlers`` (wires the parts and registers them with kopf), its parts ``control_pass``,
``reconcile``, ``clients``, ``environment``, ``status_writer``, ``leader_gate``, ``memory`` and
``resource`` (docs/architecture.md, contract ``operator-k8s-parts``), ``kube`` (``KubeClient``),
``platform`` (``KubernetesPlatform``), ``cli`` (``multilane operator``).
"""
