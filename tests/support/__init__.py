"""Test support shipped with the test suite: servers and fakes that stand in for a cluster.

- ``support.kubeapi``: ``KubeAPIServer``, a Kubernetes API server over real HTTP with an
  in-memory store (resource versions, watches with 410, selectors, /scale, /status, eviction
  with PodDisruptionBudgets, scripted faults, a request log).
- ``support.mig_manager``: ``MigManager``, a fake NVIDIA MIG manager reacting to node labels.
"""
