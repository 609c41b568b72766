"""Harnesses that evaluation teams already use, with stockade as their sandbox.

- ``stockade.harness._inspect``: the ``stockade`` sandbox environment of
  Inspect AI, registered through Inspect's ``inspect_ai`` entry-point group
  (``_inspect_registry``), so that installing stockade is enough for
  ``sandbox="stockade"``.
- ``stockade.harness._compose``: what of a Docker compose file maps onto a
  stockade policy and image, and a clear error for the rest.
- ``stockade.harness._record``: a sample's events into stockade's store and its
  containment report.

The Harbor environment lives in its own package (``integrations/harbor``),
since Harbor needs Python 3.12 (docs/HARNESSES.md).
"""

from __future__ import annotations

__all__: list[str] = []
