"""Leaf helpers (memory figures, timers); imports nothing else from deltaserve."""
