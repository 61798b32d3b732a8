# Only here because cffi's setuptools hook (cffi_modules) has no pyproject.toml key.
from setuptools import setup

setup(cffi_modules=["csrc/build_native.py:ffibuilder", "csrc/build_fuseshim.py:ffibuilder"])
