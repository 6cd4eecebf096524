"""The Kubernetes room: kopf handlers, the API client and the pods-and-Leases platform. Does I/O.

``handlers`` (kopf handlers over the shared controller), ``kube`` (``KubeClient``), ``platform``
(``KubernetesPlatform``), ``cli`` (``multilane operator``).
"""
