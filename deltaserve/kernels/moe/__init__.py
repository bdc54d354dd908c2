from .reference import moe_combine_reference
from .routing import route_topk

__all__ = ["moe_combine_reference", "route_topk"]
