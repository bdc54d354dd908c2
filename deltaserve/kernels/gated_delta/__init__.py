from .reference import gated_delta_chunked, gated_delta_recurrent, gdn_gates, l2norm

__all__ = ["gated_delta_chunked", "gated_delta_recurrent", "gdn_gates", "l2norm"]
