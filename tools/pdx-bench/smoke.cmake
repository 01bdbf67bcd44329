# bench_smoke: `pdx-bench transfer --quick` and `pdx-bench hash --quick`
# must both exit 0 (hash exits 1 when pdx and Python disagree).
foreach(mode transfer hash)
  execute_process(COMMAND ${BENCH} ${mode} --quick RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pdx-bench ${mode} --quick exited with ${rc}")
  endif()
endforeach()
