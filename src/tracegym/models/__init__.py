"""Models: the model-client protocol and its implementations (OpenAI-compatible chat, vLLM token client)."""
