# bench_nixl_side: `pdx-bench nixl --quick` with pdx's shim in NIXL's column
# (no NIXL build here): the mode runs every column, checks the bytes of
# every READ (the script fails otherwise), exits 0, prints both tables and
# says the NIXL column is not NIXL; pdx as it chooses reports a cost-based
# choice for host memory the peer cannot map. No timing is asserted.
execute_process(COMMAND ${BENCH} nixl --quick --json=${OUT}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pdx-bench nixl --quick exited with ${rc}")
endif()
foreach(want "NOT NIXL" "\\| READ 8448 x1 \\|" "per stage, medians"
        "pdx-auto +cma process_vm: (cost|calibrating)"
        "pdx-shm +cma memcpy" "pdx-ucx +ucx")
  if(NOT "${out}${err}" MATCHES "${want}")
    message(FATAL_ERROR "pdx-bench nixl --quick: no match for '${want}'")
  endif()
endforeach()
file(READ ${OUT} json)
if(NOT json MATCHES "\"side_by_side\"" OR NOT json MATCHES "\"pdx-auto\"")
  message(FATAL_ERROR "pdx-bench nixl --quick: JSON lacks the results")
endif()
