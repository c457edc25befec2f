"""What the policy core raises: one base, :class:`PoliciesError`.

A caller that only cares that a policy or an input to the engine was refused catches
:class:`PoliciesError`; each leaf keeps the builtin it has always been (``UnknownAffinity`` is
still a ``ValueError``) so existing handlers keep working. (:class:`~policies.loader.PolicyError`
is not an exception: it is one located problem in a policy file, which
:class:`~policies.loader.PolicyLoadError` carries.)
"""

from __future__ import annotations

__all__ = ["PoliciesError"]


class PoliciesError(Exception):
    """A policy, or an object the engine was asked to read, was refused."""
