"""TEST STAND-IN for vLLM (tests/python/vllm_standin/README.md): not vLLM.
The few types pdx.vllm and the replay test touch, following vLLM at commit
003df2961dd8830c317a61f9745ccd557da9fa06."""
STANDIN = True
VLLM_COMMIT = "003df2961dd8830c317a61f9745ccd557da9fa06"
