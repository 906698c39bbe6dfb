"""The package's version is the C++ project's: project(npurt VERSION X.Y.Z ...) in
CMakeLists.txt, compiled into the extension and written into the package metadata."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re

import npurt

CMAKELISTS = pathlib.Path(__file__).resolve().parents[2] / "CMakeLists.txt"


def cmake_version() -> str:
    m = re.search(r"(?m)^project\(npurt\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", CMAKELISTS.read_text())
    assert m, f"no project(npurt VERSION X.Y.Z ...) in {CMAKELISTS}"
    return m.group(1)


def test_version_is_the_cmake_projects():
    assert npurt.__version__ == cmake_version()


def test_metadata_agrees():
    assert importlib.metadata.version("npurt") == npurt.__version__
