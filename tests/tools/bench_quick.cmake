# bench_quick: `pdx-bench --quick` as a user runs it: exit 0; the summary
# first (the run's wall time and the machine's load, the verdict on
# whether the figures mean anything, a table of every mode's targets),
# then the details; each of pdx's warnings said once; under 30 s unless
# pdx-bench itself found the machine too loaded (then it must say so);
# and `pdx-bench plot` makes the SVGs from its JSON (checked where gnuplot
# is installed; required under scripts/test.sh: PDX_TEST_REQUIRE_DEPS).
set(out ${WORK}/bench-quick.txt)
set(json ${WORK}/bench-quick.json)
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${BENCH} --quick --json=${json}
  OUTPUT_FILE ${out} ERROR_VARIABLE err RESULT_VARIABLE rc)
file(READ ${out} text)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pdx-bench --quick exited ${rc}:\n${err}\n${text}")
endif()
string(REGEX MATCH "^pdx-bench all --quick: [0-9.]+ s; [0-9]+ cpus" head
  "${text}")
if(NOT head)
  message(FATAL_ERROR "the summary is not first:\n${text}")
endif()
foreach(want "\nmode +target +value +goal +verdict\n" "\ntransfer " "\nhandoff "
             "\nhash " "\noffload " "\nidle " "\nlatency " "\ndetails\n")
  if(NOT text MATCHES "${want}")
    message(FATAL_ERROR "no '${want}' in the output:\n${text}")
  endif()
endforeach()
string(FIND "${text}" "\ndetails\n" details)
string(SUBSTRING "${text}" 0 ${details} summary)
string(REGEX MATCHALL "\n" lines "${summary}")
list(LENGTH lines nlines)
if(nlines GREATER 45)
  message(FATAL_ERROR "the summary is ${nlines} lines, not one screen")
endif()
string(REGEX MATCHALL "slower path" slow "${text}${err}")
list(LENGTH slow nslow)
if(nslow GREATER 1)
  message(FATAL_ERROR "a warning said ${nslow} times:\n${err}\n${text}")
endif()
file(READ ${json} j)
string(JSON wall GET "${j}" wall_s)
string(JSON loaded GET "${j}" load too_loaded)
if(wall GREATER_EQUAL 30)
  if(NOT loaded)
    message(FATAL_ERROR "pdx-bench --quick took ${wall} s on a machine it "
                        "found quiet")
  endif()
  if(NOT text MATCHES "MACHINE TOO LOADED")
    message(FATAL_ERROR "${wall} s and no word about the load")
  endif()
endif()
execute_process(COMMAND ${BENCH} plot ${json} --out ${WORK}
  RESULT_VARIABLE prc OUTPUT_VARIABLE pout ERROR_VARIABLE perr)
find_program(GNUPLOT gnuplot)
if(NOT GNUPLOT AND "$ENV{PDX_TEST_REQUIRE_DEPS}" STREQUAL "1")
  message(FATAL_ERROR "gnuplot not installed (Debian: gnuplot-nox), but "
                      "PDX_TEST_REQUIRE_DEPS=1 (scripts/deps.sh installs it)")
endif()
if(GNUPLOT)
  foreach(svg transfer latency handoff targets)
    if(NOT prc EQUAL 0 OR NOT EXISTS ${WORK}/bench-${svg}.svg)
      message(FATAL_ERROR "pdx-bench plot: no bench-${svg}.svg (${prc}):\n"
                          "${pout}${perr}")
    endif()
  endforeach()
endif()
message(STATUS "pdx-bench --quick: ${wall} s, too loaded: ${loaded}")
