from .reference import paged_attention, write_kv

__all__ = ["paged_attention", "write_kv"]
