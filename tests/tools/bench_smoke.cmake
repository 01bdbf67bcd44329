# bench_smoke: `pdx-bench transfer --quick`, `hash --quick` and `idle --quick`
# must each exit 0 (hash exits 1 when pdx and Python disagree; idle only
# reports, it asserts no timing).
foreach(mode transfer hash idle)
  execute_process(COMMAND ${BENCH} ${mode} --quick RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pdx-bench ${mode} --quick exited with ${rc}")
  endif()
endforeach()
