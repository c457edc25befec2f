"""Test support shipped with the test suite: servers and fakes that stand in for a cluster.

- ``support.kubeapi``: ``KubeAPIServer``, a Kubernetes API server over real HTTP with an
  in-memory store (resource versions, watches with 410, selectors, /scale, /status, eviction
  with PodDisruptionBudgets, scripted faults, a request log), authorizing every request as RBAC
  would against the roles the Helm chart renders (``support.kubeapi_rbac``), and refusing what
  owners' admission webhooks refuse (``support.jobset_webhook``).
- ``support.mig_manager``: ``MigManager``, a fake NVIDIA MIG manager reacting to node labels.
"""
