"""Reductions and scans for the Triton kernels, built from builtins only.

triton.language's own tl.sum, tl.max, tl.min and tl.cumsum are jit functions made when
triton is first imported, so they are compiled-mode objects if anything imported triton
before TRITON_INTERPRET was set, and the interpreter then refuses them.  These combine
functions are made with each kernel, in the mode that kernel is built in."""
from __future__ import annotations


def combiners() -> tuple:
    """(_add, _most, _least): jit functions for tl.reduce and tl.associative_scan; a
    kernel's builder binds them by these names and puts them among its module's globals
    (where the compiler looks a kernel's callees up)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _most(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _least(a, b):
        return tl.minimum(a, b)

    return _add, _most, _least


def lower(fn, signature: dict, constexprs: dict, arch: int, num_warps: int):
    """fn compiled for sm_<arch> as a GPU would run it (no GPU needed): Triton's compiled
    object, its asm["ptx"] and asm["cubin"]."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
