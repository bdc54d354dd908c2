"""The engine: requests, scheduler, block/slot pools, runner, sampling glue, detokeniser, and the LLM API.

A step is schedule -> execute -> update (see engine.py). Everything except runner.execute is pure Python and
CPU-testable.
"""
