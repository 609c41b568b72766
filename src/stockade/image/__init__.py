"""Images: a task's own system as a cell's ``/``, imported or built with no
container engine, kept in a content-addressed store (docs/IMAGES.md).

``default_store().get(ref)`` gives an ``Image`` (digest, names, flattened
rootfs, config, provenance) that ``Cell(policy, image=…)`` runs on.
``import_image`` reads an OCI layout or a ``docker save`` tarball. Building
from a Dockerfile is ``stockade.image._build.build_image``, not re-exported
here: it runs build cells, and the cell layer imports this package (for
``image: REF``), so the import graph would close a circle through it.
"""

from __future__ import annotations

from stockade.errors import ImageError
from stockade.image._import import import_image
from stockade.image._model import Image, ImageConfig
from stockade.image._store import ImageStore, PruneReport, default_store

__all__ = ["Image", "ImageConfig", "ImageError", "ImageStore", "PruneReport", "default_store", "import_image"]
