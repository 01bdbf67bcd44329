"""TEST STAND-IN for vLLM (see tests/python/vllm_standin/README.md)."""
