"""TEST STAND-IN for vLLM (tests/python/vllm_standin/README.md): the
fields of vllm.v1.request.Request that PdxConnector and the replay's
scheduler read, with vLLM's names and meaning."""
import enum


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status):
        return status > RequestStatus.PREEMPTED


class Request:
    def __init__(self, request_id, prompt_token_ids, max_tokens,
                 kv_transfer_params=None, block_hashes=None,
                 lora_request=None, cache_salt=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self._all_token_ids = list(prompt_token_ids)
        self._output_token_ids = []
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_tokens = max_tokens
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.kv_transfer_params = kv_transfer_params
        self.block_hashes = list(block_hashes or [])
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = []
        self.prompt_embeds = None
        self.num_preemptions = 0

    @property
    def num_tokens(self):
        return len(self._all_token_ids)

    @property
    def all_token_ids(self):
        return self._all_token_ids

    @property
    def output_token_ids(self):
        return self._output_token_ids

    @property
    def num_output_tokens(self):
        return len(self._output_token_ids)

    def append_output_token_ids(self, token):
        self._output_token_ids.append(token)
        self._all_token_ids.append(token)

    def is_finished(self):
        return RequestStatus.is_finished(self.status)
