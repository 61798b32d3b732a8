"""Views turn an image entry into bytes: q1..qG (JPEG at fidelity k) and, later, others."""
from pcrfs.views.qk import QView, parse_view

__all__ = ["QView", "parse_view"]
