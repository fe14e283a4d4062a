"""The OpenAI-compatible API (docs/openai.md): chat, completions, embeddings and models over
any model with the vLLM backend's tensors, on the HTTP port beside the KServe routes and on
`--openai-port`."""

from oceanus.frontends.openai.app import OpenAIFrontend

__all__ = ["OpenAIFrontend"]
