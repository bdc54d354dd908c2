"""The OpenAI-compatible HTTP server (`deltaserve serve`, docs/server.md): protocol models, reasoning and tool-call
parsing, metrics, the FastAPI app and the chat page, over engine.async_engine.AsyncLLMEngine."""
