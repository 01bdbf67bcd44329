"""TEST STAND-IN for vLLM (tests/python/vllm_standin/README.md): the block
list update_state_after_alloc is given."""


class KVCacheBlocks:
    def __init__(self, block_ids):
        self._ids = list(block_ids)

    def get_block_ids(self, allow_none=False):
        """One list of block ids per KV cache group (one group here)."""
        return (list(self._ids),)
