"""The Kubernetes adapter of the cluster port: watches in, API calls out.

The only package that imports ``kubernetes_asyncio``. Its modules: ``client`` (configuration and
the error tree with retries), ``leader`` (Lease-based leader election), and the cluster state
and actuators built on them.
"""
