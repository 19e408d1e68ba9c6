"""Import-only stand-in for torchvision, put on PYTHONPATH by kv_layouts.py.

A CPU torch cannot load PyPI's (CUDA) torchvision. vLLM 0.32's qwen3_5.py imports the Qwen-VL
image processor, which imports torchvision at module level; a text-only tiny model never calls
it. Every torchvision.* submodule is a module whose attributes are inert classes.
"""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0"


class _InertMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return name   # enum-like members (InterpolationMode.BICUBIC, ...)


class _Inert(metaclass=_InertMeta):
    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        raise RuntimeError("torchvision stand-in called")

    def __getattr__(self, name):
        return _Inert()


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_Inert,), {})
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__path__ = []
