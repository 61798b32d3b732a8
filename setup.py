# Here because cffi's setuptools hook (cffi_modules) and the proto compile step have no
# pyproject.toml key.
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    """Also compiles pcrfs/csi/csi.proto (the CSI node plugin's messages and services)
    with grpcio-tools into the built package: pcrfs.csi.csi_pb2 and csi_pb2_grpc."""

    def run(self):
        super().run()
        import grpc_tools
        from grpc_tools import protoc
        well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        rc = protoc.main(["protoc", "-I.", f"-I{well_known}", f"--python_out={self.build_lib}",
                          f"--grpc_python_out={self.build_lib}", "pcrfs/csi/csi.proto"])
        if rc != 0:
            raise SystemExit(f"protoc failed on pcrfs/csi/csi.proto ({rc})")


setup(cffi_modules=["csrc/build_native.py:ffibuilder", "csrc/build_fuseshim.py:ffibuilder"],
      cmdclass={"build_py": BuildPy})
