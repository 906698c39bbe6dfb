"""The type stubs describe every public name of the package and every public member
of its classes."""

from __future__ import annotations

import ast
import inspect
import pathlib

import npurt
import npurt.isa
import npurt.ops
from npurt import _npurt


def stub_tree() -> ast.Module:
    path = pathlib.Path(_npurt.__file__).with_name("_npurt.pyi")
    assert path.is_file(), f"no stub next to {_npurt.__file__}"
    return ast.parse(path.read_text())


def test_stub_names_every_public_name():
    tree = stub_tree()
    top = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    for module in (npurt, npurt.ops, npurt.isa):
        for name in module.__all__:
            obj = getattr(module, name)
            # Submodules, and npurt.isa's register constants (r0 ..., instances of Reg).
            if inspect.ismodule(obj) or not (inspect.isclass(obj) or callable(obj)):
                continue
            assert name in top, f"{module.__name__}.{name} is missing from _npurt.pyi"


def test_stub_names_every_public_member():
    tree = stub_tree()
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name, cls in vars(_npurt).items():
        if not inspect.isclass(cls) or name.startswith("_") or issubclass(cls, BaseException):
            continue
        members = {n.name for n in classes[name].body if isinstance(n, ast.FunctionDef)}
        for attr in vars(cls):
            if not attr.startswith("_"):
                assert attr in members, f"{name}.{attr} is missing from _npurt.pyi"


def test_package_is_typed():
    assert (pathlib.Path(npurt.__file__).parent / "py.typed").is_file()
