"""The pure core: policy model and loading, sliding windows, the decision engine.

Imports event *types* from :mod:`streams.events` and nothing that does I/O.
"""
