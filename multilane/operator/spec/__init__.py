"""The spec room: what a ParallelConsumer asks for and what it shows. Pure: no I/O.

``validation`` (spec checks the CRD schema cannot express), ``children`` (manifests of the children),
``conditions`` (status conditions and their transitions).
"""
