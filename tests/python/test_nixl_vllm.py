"""pdx in NIXL's place under vLLM's newest pull-mode NixlConnector worker
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py and
pull_worker.py), its NIXL calls made as that code makes them, through the
'nixl' package (importlib.import_module("nixl._api"), as vllm's
nixl_utils does):

* agents named str(uuid4()) with nixl_agent_config(num_threads=4,
  capture_telemetry=True) (UCX, no backends list);
* K and V of each layer registered as separate regions with
  get_reg_descs([(addr, len, dev, "")], "DRAM") and
  register_memory(descs, backends=["UCX"]); local lists prepared with
  "NIXL_INIT_AGENT", region-major, one descriptor per block;
* heterogeneous TP (D tp 2, P tp 1): each of two D ranks prepares a remote
  list of its head slice of every P block (rank_offset * half) and READs
  it with make_prepped_xfer("READ", ..., np.int64 ids from
  region * nblocks + block, notif_msg=b"<req>:2") + transfer();
  check_xfer_state "DONE"/"PROC", get_xfer_telemetry on DONE (vLLM's
  stats read descCount/totalBytes/xferDuration/postDuration),
  release_xfer_handle; P frees a request after 2 notifications;
* heartbeats send_notif(agent, notif_msg=b"HB:req-a,req-b");
* TTL eviction (_cleanup_remote_engine: release_dlist_handle,
  remove_remote_agent) and a new handshake to the same P, which READs
  again;
* P killed: check_xfer_state / transfer raise or report a failure (never
  hang), release_xfer_handle of the failed handle and vLLM's shutdown
  order (release handles, dlists, remove_remote_agent, deregister_memory)
  raise nothing.
Every byte read is compared with P's. The D side's sequences live in
nixl_vllm_workers.py, so that test_nixl_vram.py runs them too, with GPU
memory on two hosts."""
import multiprocessing as mp
import os
import signal

import nixl_vllm_workers as wk


def _spawn(*args):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=wk.vllm_prefill, args=(child,) + args,
                       daemon=True)
    proc.start()
    child.close()
    return parent, proc


def test_vllm_pull_hetero_tp():
    """The decode engine's sequence (nixl_vllm_workers.d_pull_hetero_tp)
    in this process, host memory on both sides; test_nixl_vram.py runs it
    with GPU memory between two hosts."""
    api = wk.nixl_api()
    seed = 5
    conn, proc = _spawn(seed, ["req-a", "req-b", "req-c"])
    try:
        wk.d_pull_hetero_tp(api, conn, seed)
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)


def test_vllm_prefill_killed():
    """P dies (SIGKILL) under a READ vLLM posted and under one it posts
    after (nixl_vllm_workers.d_prefill_killed): each ends with an
    exception or a non-DONE state within a bound, check_remote_metadata
    turns False, and vLLM's failure path (release_xfer_handle) and
    shutdown raise nothing."""
    api = wk.nixl_api()
    seed = 9
    conn, proc = _spawn(seed, ["never"])

    def kill_p():
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
    try:
        wk.d_prefill_killed(api, conn, seed, kill_p)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(10)
